"""Lateness split into the claim's lag and the executor's, per time bin and group of 4 partitions.

python lag.py export.csv [bin_seconds]   # rows: partition, due_at, executed_at, queued_at
"""

import csv
import sys
from datetime import datetime


def pct(values, k):
    values = sorted(values)
    return values[min(len(values) - 1, int(k * len(values)))]


def read_export(path):
    """The export's rows as (partition, due_at, executed_at, queued_at), and the first due_at."""
    parse = datetime.fromisoformat
    with open(path) as f:
        rows = [(int(p), parse(d), parse(e), parse(q)) for p, d, e, q in csv.reader(f)]
    return rows, min(r[1] for r in rows)


def main(path, width=15):
    rows, t0 = read_export(path)
    bins = {}
    for p, due, ex, queued in rows:
        key = (int((due - t0).total_seconds() // width), p // 4)
        claim = max((queued - due).total_seconds(), 0)
        execute = (ex - max(queued, due)).total_seconds()
        bins.setdefault(key, []).append((claim, execute, (ex - due).total_seconds()))
    print("bin(s) grp n claim_p50 claim_p99 exec_p50 exec_p99 late_p50 late_p99")
    for (b, g), v in sorted(bins.items()):
        cols = [[x[i] for x in v] for i in range(3)]
        cells = " ".join(f"{pct(c, q):6.2f}" for c in cols for q in (0.5, 0.99))
        print(f"{b * width:5d} {g} {len(v):6d} {cells}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 15)
