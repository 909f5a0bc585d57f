"""Transactions (payments sharing one executed_at) from A to B s: size, lateness, partitions.

python tx.py export.csv A B
"""

import sys

from lag import read_export


def main(path, lo, hi):
    rows, t0 = read_export(path)
    tx = {}
    for p, due, ex, _ in rows:
        tx.setdefault(ex, []).append((p, due))
    out = []
    for ex, items in tx.items():
        t = (ex - t0).total_seconds()
        if lo <= t < hi:
            oldest = (ex - min(d for _, d in items)).total_seconds()
            newest = (ex - max(d for _, d in items)).total_seconds()
            out.append((t, len(items), oldest, newest, sorted({p for p, _ in items})))
    for t, n, oldest, newest, parts in sorted(out):
        print(f"{t:8.2f} n={n:4d} oldest_late={oldest:6.2f} newest_late={newest:6.2f} {parts}")


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]))
