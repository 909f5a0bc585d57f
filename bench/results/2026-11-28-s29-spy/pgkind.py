"""Sample PostgreSQL server processes' CPU by kind (diagnostic): a cumulative line every 10 s."""
import re, sys, time, json
import psutil

def kind(cmd):
    if "autovacuum worker" in cmd: return "autovacuum"
    for k in ("checkpointer", "walwriter", "background writer", "autovacuum launcher"):
        if k in cmd: return k
    m = re.match(r"postgres: \S+ (\S+) ", cmd)
    if m: return "be:" + m.group(1)
    return "other"

def sample():
    out = {}
    for p in psutil.process_iter(["name", "cmdline", "cpu_times"]):
        if p.info["name"] not in ("postgres", "postmaster") or not p.info["cpu_times"]:
            continue
        cmd = " ".join(p.info["cmdline"] or [])
        t = p.info["cpu_times"]
        out[p.pid] = (kind(cmd), t.user + t.system)
    return out

seconds = float(sys.argv[1])
first = sample(); last = dict(first)
t0 = time.monotonic(); end = t0 + seconds; nxt = t0 + 10
while time.monotonic() < end:
    time.sleep(0.25)
    for pid, v in sample().items():
        last[pid] = v
    if time.monotonic() >= nxt:
        nxt += 10
        by = {}
        for pid, (k, cpu) in last.items():
            by[k] = by.get(k, 0.0) + cpu - first.get(pid, (k, 0.0))[1]
        print(time.strftime("%H:%M:%S"), json.dumps({k: round(v, 1) for k, v in sorted(by.items())}), flush=True)
