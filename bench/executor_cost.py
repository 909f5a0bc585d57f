"""Entry point of ``bench/scenarios/executor_cost.py`` (same options; see its docstring)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scenarios.executor_cost import main

if __name__ == "__main__":
    sys.exit(main())
