import psycopg, uuid, time, datetime as dt, re, os
from psycopg.pq import Format
raw = open("/tmp/pgc/insert.sql").read()
usql = re.sub(r"\$\d+", "%b", raw)
conn = psycopg.connect("host=127.0.0.1 user=postgres dbname=scheduler_bench_apicost", prepare_threshold=None)
cur = psycopg.ServerCursor if False else psycopg.Cursor(conn)
cur.execute("select pg_backend_pid()"); backend = cur.fetchone()[0]
cur.execute("select id, owner_id from ledger_account where owner_id is not null order by id limit 2")
(a, owner), (b, _) = cur.fetchall()
conn.commit()
tick = os.sysconf("SC_CLK_TCK")
def cpu():
    f = open(f"/proc/{backend}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick
now = dt.datetime.now(dt.timezone.utc)
def row():
    return [uuid.uuid4(), a, b, owner, 1, "", "{}", "PENDING", now, now, 3, 0, None, 0, None, None, "", "", None, now, now, None, None]
types = re.findall(r"%b::([^,)]+(?:\([0-9]+\))?(?: with time zone)?)\[\]", usql)
assert len(types) == 23, types
cols = re.search(r'INSERT INTO "payments_payment" \((.*?)\) SELECT', usql).group(1)
vsql = f'INSERT INTO "payments_payment" ({cols}) VALUES (' + ", ".join(f"%b::{t}" + ("::jsonb" if i == 6 else "") for i, t in enumerate(types)) + ') RETURNING "id"'
variants = {"unnest": (usql, lambda: [[v] for v in row()]), "values": (vsql, row)}
N = 2000
for rnd in range(2):
  for name, (sql, mk) in variants.items():
    for i in range(50): cur.execute(sql, mk())
    conn.rollback()
    c0, t0 = cpu(), time.perf_counter()
    for i in range(N):
        cur.execute(sql, mk())
        if i % 20 == 19: conn.rollback()
    conn.rollback()
    print(f"{name}: backend {1000*(cpu()-c0)/N:.3f} ms CPU, wall {1000*(time.perf_counter()-t0)/N:.3f} ms per insert")
