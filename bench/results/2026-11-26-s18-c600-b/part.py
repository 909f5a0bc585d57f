"""The executor's lag per partition for payments due between A and B seconds into the export.

python part.py export.csv A B
"""

import csv
import sys
from datetime import datetime


def main(path, lo, hi):
    parse = datetime.fromisoformat
    with open(path) as f:
        rows = [(int(p), parse(d), parse(e), parse(q)) for p, d, e, q in csv.reader(f)]
    t0 = min(r[1] for r in rows)
    per = {}
    for p, due, ex, queued in rows:
        if lo <= (due - t0).total_seconds() < hi:
            per.setdefault(p, []).append((ex - max(queued, due)).total_seconds())
    for p in sorted(per):
        v = sorted(per[p])
        print(p, len(v), round(v[len(v) // 2], 2), round(v[int(0.99 * len(v))], 2))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]))
