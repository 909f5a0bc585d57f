"""Entry point of ``bench/scenarios/soak.py`` (same options; see its docstring)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scenarios.soak import main

if __name__ == "__main__":
    sys.exit(main())
