"""Sample lock waits (pg_stat_activity) and the executor's counters during a bench run.
Writes one JSON line per second to argv[1]: lock-wait samples (4 per second), active backends,
and the stale/collapsed/batch counters summed over the capacity scenario's multiprocess dir."""
import glob, json, sys, time
import psycopg
from prometheus_client import CollectorRegistry, multiprocess

out = open(sys.argv[1], "a", buffering=1)
conn = psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True)
Q = """select wait_event_type, wait_event, left(query, 60) from pg_stat_activity
       where state='active' and pid<>pg_backend_pid() and backend_type='client backend'"""
NAMES = {"payments_stale_deliveries", "payments_collapsed", "payments_executor_batch_size", "payments_chunk_items_busy"}
def counters():
    d = {}
    for path in glob.glob("/tmp/bench-capacity-metrics-*"):
        try:
            reg = CollectorRegistry(); multiprocess.MultiProcessCollector(reg, path=path)
            for fam in reg.collect():
                if fam.name in NAMES:
                    for s in fam.samples:
                        if s.name.endswith(("_total", "_count", "_sum")):
                            d[s.name] = d.get(s.name, 0) + s.value
        except Exception as e:
            d["err"] = str(e)[:80]
    return d
while True:
    t = time.time(); locks = 0; active = 0; lockq = {}
    for _ in range(4):
        for wt, we, q in conn.execute(Q).fetchall():
            active += 1
            if wt == "Lock":
                locks += 1; k = f"{we}:{q[:40]}"; lockq[k] = lockq.get(k, 0) + 1
        time.sleep(0.25)
    out.write(json.dumps({"t": round(t, 1), "locks": locks, "active": active, "lockq": lockq, **counters()}) + "\n")
