"""Sample lock waits every 5 ms, labelled by process kind (web/worker) of waiter and blocker."""
import collections, sys, time, psycopg, psutil
db = sys.argv[1]; seconds = float(sys.argv[2])
conn = psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{db}", autocommit=True)
kinds = {}
def kind_of_port(port):
    if port in kinds: return kinds[port]
    for c in psutil.net_connections(kind="tcp"):
        if c.laddr and c.raddr and c.raddr.port == 5432 and c.pid:
            try:
                cmd = " ".join(psutil.Process(c.pid).cmdline())
            except Exception:
                cmd = "?"
            k = "web" if "gunicorn" in cmd else "timers" if "timer" in cmd else "beat" if " beat" in cmd else "worker" if "celery" in cmd else "other"
            kinds[c.laddr.port] = k
    return kinds.get(port, "?")
waits = collections.Counter(); states = collections.Counter(); n = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    rows = conn.execute("""select pid, client_port, coalesce(wait_event_type,'CPU'), left(regexp_replace(query,'\\s+',' ','g'),50), state, pg_blocking_pids(pid)
      from pg_stat_activity where datname=%s and pid<>pg_backend_pid()""", (db,)).fetchall()
    n += 1
    bypid = {r[0]: r for r in rows}
    for pid, port, wt, q, st, blockers in rows:
        k = kind_of_port(port)
        states[(k, st, wt)] += 1
        if wt == 'Lock':
            for b in blockers[:1]:
                br = bypid.get(b)
                bk = kind_of_port(br[1]) if br else "?"
                waits[(k, q[:40], "<-", bk, br[4] if br else "?", br[3][:40] if br else "?")] += 1
    time.sleep(0.1)
print("samples", n)
print("-- states (avg backends)")
for k, v in states.most_common(20): print(f"{v/n:7.3f}", k)
print("-- lock waits: waiter <- first blocker (avg backends)")
for k, v in waits.most_common(20): print(f"{v/n:7.3f}", k)
