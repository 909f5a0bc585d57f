"""PostgreSQL backend CPU per API request, by kind (one persistent connection, no pool)."""
import json, os, sys, time, tempfile, uuid
sys.path.insert(0, "/work/main")
from bench.scenarios import api_cost
from bench.harness.db import prepare
from bench.harness.api_load import create_client

prepare(api_cost.DATABASE, api_cost.REDIS_DB, API_THROTTLE_RATE="1000000/s", DB_POOL="false",
        CONN_MAX_AGE="600", PROMETHEUS_MULTIPROC_DIR=tempfile.mkdtemp())
info = create_client("pgclient", accounts=2, balance=10**12)
src, dst = info["account_ids"]
http = api_cost.WsgiClient(f"Bearer {info['token']}")
body = json.dumps({"from_account_id": src, "to_account_id": dst, "amount": 1, "delay_seconds": 3600}).encode()
from django.db import connection
pid = json.loads(http.request("POST", "/api/v1/payments/schedule", body).content)["payment_id"]
with connection.cursor() as c:
    c.execute("SELECT pg_backend_pid()")
    backend = c.fetchone()[0]
tick = os.sysconf("SC_CLK_TCK")
def cpu():
    f = open(f"/proc/{backend}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick
kinds = {
    "schedule": lambda: http.request("POST", "/api/v1/payments/schedule", body),
    "schedule_key": lambda: http.request("POST", "/api/v1/payments/schedule", body, {"Idempotency-Key": str(uuid.uuid4())}),
    "status": lambda: http.request("GET", f"/api/v1/payments/{pid}"),
}
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
for name, call in kinds.items():
    for _ in range(20): call()
    with connection.cursor() as c:
        c.execute("SELECT pg_backend_pid()"); assert c.fetchone()[0] == backend
    c0, w0, p0 = cpu(), time.perf_counter(), time.process_time()
    for _ in range(n):
        r = call()
        assert r.status_code in (200, 201), r.content
    c1, w1, p1 = cpu(), time.perf_counter(), time.process_time()
    print(f"{name}: PostgreSQL backend {1000*(c1-c0)/n:.3f} ms CPU, python {1000*(p1-p0)/n:.3f} ms, wall {1000*(w1-w0)/n:.3f} ms per request (n={n})")

if os.environ.get("SHAPES"):
    from collections import defaultdict
    from django.test.utils import CaptureQueriesContext
    tot = defaultdict(float); cnt = defaultdict(int)
    for _ in range(300):
        with CaptureQueriesContext(connection) as ctx:
            kinds[os.environ["SHAPES"]]()
        for q in ctx.captured_queries:
            k = " ".join(q["sql"].split())[:110]
            tot[k] += float(q["time"]); cnt[k] += 1
    for k in sorted(tot, key=tot.get, reverse=True):
        print(f"{1000*tot[k]/300:7.3f} ms/request  x{cnt[k]/300:.0f}  {k}")

if os.environ.get("DUMP"):
    from django.test.utils import CaptureQueriesContext
    with CaptureQueriesContext(connection) as ctx:
        kinds["schedule"]()
    for q in ctx.captured_queries:
        if q["sql"].startswith('INSERT INTO "payments_payment"'):
            open("/tmp/pgc/insert.sql", "w").write(q["sql"])

if os.environ.get("STATS"):
    import re as _re
    from collections import defaultdict
    notes = []
    raw = connection.connection
    raw.add_notice_handler(lambda d: notes.append((d.message_primary, d.message_detail)))
    with connection.cursor() as c:
        c.execute("SET log_statement_stats = on")
        c.execute("SET client_min_messages = log")
    kind = os.environ["STATS"]
    per = defaultdict(list)
    for i in range(200):
        notes.clear()
        kinds[kind]()
        for j, d in enumerate(notes):
            m = _re.search(r"([\d.]+) s user, ([\d.]+) s system, ([\d.]+) s elapsed", d[1] or "")
            if m:
                per[j].append((float(m.group(1)) + float(m.group(2)), float(m.group(3))))
    notes.clear(); kinds[kind](); notes_kinds = [n[0] for n in notes]
    for j in sorted(per):
        v = per[j]
        print(f"{notes_kinds[j]:40s} {j}: cpu {1000*sum(a for a,_ in v)/len(v):.3f} ms, elapsed {1000*sum(b for _,b in v)/len(v):.3f} ms (n={len(v)})")
    # the statements of one request, in order
    notes.clear()
    from django.test.utils import CaptureQueriesContext
    with CaptureQueriesContext(connection) as ctx:
        kinds[kind]()
    for q in ctx.captured_queries: print("  ", " ".join(q["sql"].split())[:90])
