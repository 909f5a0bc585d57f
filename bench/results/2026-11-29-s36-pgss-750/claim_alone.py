import os, sys, time, psycopg
SQL = open('/work/main/payments/transitions.py').read().split('_CLAIM_SQL_TEMPLATE = """')[1].split('"""')[0]
SQL = SQL.format(cutoff="run_at <= statement_timestamp() + interval '1 hour'").replace('{}', '{}')
SQL = SQL.replace("'{{}}'", "'{}'")
conn = psycopg.connect("host=127.0.0.1 user=postgres dbname=scheduler_bench_capacity", autocommit=True)
pid = conn.execute("select pg_backend_pid()").fetchone()[0]
tick = os.sysconf('SC_CLK_TCK')
def cpu():
    f = open(f'/proc/{pid}/stat').read().rsplit(')',1)[1].split()
    return (int(f[11]) + int(f[12])) / tick
def run(limit, times):
    c0, t0, rows = cpu(), time.perf_counter(), 0
    for _ in range(times):
        rows += len(conn.execute(SQL, {"limit": limit, "lease": 60}).fetchall())
    c1, t1 = cpu(), time.perf_counter()
    print(f"limit {limit} x{times}: rows {rows}, wall {1000*(t1-t0)/rows:.3f} ms/row, backend CPU {1000*(c1-c0)/rows:.3f} ms/row, {1000*(t1-t0)/times:.1f} ms/call")
for spec in sys.argv[1:]:
    l, n = map(int, spec.split('x'))
    run(l, n)
