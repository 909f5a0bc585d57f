"""``python -m bench.chaos``: the same as ``bench/chaos.py``."""

import sys

from bench.chaos.run import main

sys.exit(main())
