"""The executor's lag per partition for payments due between A and B seconds into the export.

python part.py export.csv A B
"""

import sys

from lag import read_export


def main(path, lo, hi):
    rows, t0 = read_export(path)
    per = {}
    for p, due, ex, queued in rows:
        if lo <= (due - t0).total_seconds() < hi:
            per.setdefault(p, []).append((ex - max(queued, due)).total_seconds())
    for p in sorted(per):
        v = sorted(per[p])
        print(p, len(v), round(v[len(v) // 2], 2), round(v[int(0.99 * len(v))], 2))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]))
