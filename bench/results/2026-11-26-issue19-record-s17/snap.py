"""Two snapshots of every process's CPU (and /proc/stat), N seconds apart: who used the host."""
import os, sys, time, json
from collections import Counter
HZ = os.sysconf("SC_CLK_TCK")
def procs():
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        try:
            stat = open(f"/proc/{pid}/stat").read()
            cmd = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:120]
        except OSError:
            continue
        rest = stat[stat.rindex(")") + 2:].split()
        comm = stat[stat.index("(") + 1: stat.rindex(")")]
        out[int(pid)] = (comm, cmd, (int(rest[11]) + int(rest[12])) / HZ)
    return out
def cpustat():
    f = open("/proc/stat").readline().split()[1:]
    names = "user nice system idle iowait irq softirq steal".split()
    return {n: int(v) / HZ for n, v in zip(names, f)}
def label(comm, cmd):
    if comm.startswith("postgres") or "postgres" in cmd[:30]: return "postgres"
    if "redis" in comm: return "redis"
    if "celery" in cmd and "timers" in cmd: return "timers"
    if "celery beat" in cmd or ("celery" in cmd and " beat" in cmd): return "beat"
    if "celery" in cmd or "celeryd" in cmd: return "worker"
    if "gunicorn" in cmd: return "web"
    if "bench" in cmd: return "bench"
    return "other:" + comm
seconds = float(sys.argv[1])
a, sa = procs(), cpustat()
time.sleep(seconds)
b, sb = procs(), cpustat()
use = Counter()
for pid, (comm, cmd, t) in b.items():
    use[label(comm, cmd)] += t - (a[pid][2] if pid in a else 0.0)
stat = {k: round(sb[k] - sa[k], 1) for k in sa}
print(json.dumps({"seconds": seconds, "by_process": {k: round(v, 1) for k, v in use.most_common() if v > 0.05}, "proc_stat": stat}, indent=1))
