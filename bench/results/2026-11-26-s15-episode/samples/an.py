"""Print the sampler's per-second rows between two offsets (seconds from the first).

python an.py FROM TO [samples.jsonl]
"""

import gzip
import json
import sys
import time

PAYMENT_QUEUE_SKIP = ("recurring", "webhooks", "timers", "default")


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f]


def line(r: dict, prev: dict, t0: float) -> str:
    cpu = r["cpu"]
    overdue = {s[0]: (n, round(float(age or 0), 1)) for s, n, age in r.get("overdue", [])}
    queued = sum(v for k, v in r["queues"].items() if k.split(":")[1] not in PAYMENT_QUEUE_SKIP)
    db, bg, pdb, pbg = r["db"], r["bgwriter"], prev["db"], prev["bgwriter"]
    waits = {k[:12]: v for k, v in r["activity"]}
    wal_kb = (int(r["wal_lsn"]) - int(prev["wal_lsn"])) // 1024
    return (
        f"{time.strftime('%H:%M:%S', time.gmtime(r['t']))} {r['t'] - t0:4.0f}"
        f" pg {cpu.get('postgres', 0):4.2f} wk {cpu.get('worker', 0):4.2f}"
        f" tm {cpu.get('timers', 0):4.2f} web {cpu.get('web', 0):4.2f}"
        f" commits {db[0] - pdb[0]:4d} updated {db[5] - pdb[5]:5d} reads {db[2] - pdb[2]:4d}"
        f" backend-writes {bg[4] - pbg[4]:4d} checkpoint-writes {bg[2] - pbg[2]:4d}"
        f" wal {wal_kb:5d}k dead {r['table'][1]:6d} messages {queued:4d}"
        f" overdue {overdue} {waits} sample {r['sample_s']}"
    )


def main() -> None:
    lo, hi = float(sys.argv[1]), float(sys.argv[2])
    rows = load(sys.argv[3] if len(sys.argv) > 3 else "samples.jsonl.gz")
    t0, prev = rows[0]["t"], None
    for r in rows:
        if "table" not in r:
            prev = None
            continue
        if prev and lo <= r["t"] - t0 <= hi:
            print(line(r, prev, t0))
        prev = r


if __name__ == "__main__":
    main()
