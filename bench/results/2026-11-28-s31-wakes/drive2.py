import sys, time, os
sys.path.insert(0, "/tmp/noop2"); sys.path.insert(0, "/work/main")
import django; django.setup()
from noopmod import noop
from payments import routing
rate=float(sys.argv[1]); secs=float(sys.argv[2]); cd=float(sys.argv[3]); pids=[int(x) for x in sys.argv[4].split(",")]
import psutil
ps=[psutil.Process(p) for p in pids]
def cpu(): 
    return sum(t.user+t.system for t in (p.cpu_times() for p in ps))
time.sleep(2)
c0=cpu(); t0=time.monotonic(); n=0
items=[[f"{i:032x}", 1] for i in range(43)]
while time.monotonic()-t0 < secs:
    opts={"queue": routing.queue_name(n%16)}
    if cd: opts["countdown"]=cd
    noop.apply_async(args=[items], kwargs={"partitions":[n%16]}, **opts); n+=1
    time.sleep(max(0, t0+n/rate-time.monotonic()))
time.sleep(cd+1)
c=cpu()-c0
el=time.monotonic()-t0
print(f"rate {rate} countdown {cd}: {n} msgs in {el:.0f}s, workers CPU {c:.2f}s, {1000*c/n:.2f} ms/msg")
