"""Entry point of the chaos run, the package ``bench/chaos/`` (same options; see its docstring)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.chaos.run import main

if __name__ == "__main__":
    sys.exit(main())
