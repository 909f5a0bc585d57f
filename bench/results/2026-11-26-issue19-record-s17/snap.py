"""Two snapshots of every process's CPU (and /proc/stat), N seconds apart: who used the host.

python snap.py SECONDS   (run in a loop beside the run of record; output in log.txt)
"""

import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
STAT_FIELDS = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"]
LABELS = [  # (test on comm and cmdline, label), first match wins
    (lambda comm, cmd: comm.startswith("postgres") or "postgres" in cmd[:30], "postgres"),
    (lambda comm, cmd: "redis" in comm, "redis"),
    (lambda comm, cmd: "celery" in cmd and "timers" in cmd, "timers"),
    (lambda comm, cmd: "celery" in cmd and " beat" in cmd, "beat"),
    (lambda comm, cmd: "celery" in cmd or "celeryd" in cmd, "worker"),
    (lambda comm, cmd: "gunicorn" in cmd, "web"),
    (lambda comm, cmd: "bench" in cmd, "bench"),
]


def procs() -> dict[int, tuple[str, str, float]]:
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:120]
        except OSError:
            continue
        rest = stat[stat.rindex(")") + 2 :].split()
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        out[int(pid)] = (comm, cmd, (int(rest[11]) + int(rest[12])) / HZ)
    return out


def cpustat() -> dict[str, float]:
    values = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return {n: int(v) / HZ for n, v in zip(STAT_FIELDS, values, strict=False)}


def label(comm: str, cmd: str) -> str:
    return next((name for test, name in LABELS if test(comm, cmd)), "other:" + comm)


def main() -> None:
    seconds = float(sys.argv[1])
    before, stat_before = procs(), cpustat()
    time.sleep(seconds)
    after, stat_after = procs(), cpustat()
    use: Counter = Counter()
    for pid, (comm, cmd, cpu) in after.items():
        use[label(comm, cmd)] += cpu - (before[pid][2] if pid in before else 0.0)
    report = {
        "seconds": seconds,
        "by_process": {k: round(v, 1) for k, v in use.most_common() if v > 0.05},
        "proc_stat": {k: round(stat_after[k] - stat_before[k], 1) for k in stat_before},
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
