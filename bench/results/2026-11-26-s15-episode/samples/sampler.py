"""Per-second sampler for a capacity step: what changes when lateness rises.

python sampler.py OUT.jsonl  (runs until killed)
"""

import json
import sys
import time

import psutil
import psycopg
import redis

out = open(sys.argv[1], "a", buffering=1)  # noqa: SIM115 (open until killed)
admin = psycopg.connect("postgres://postgres@127.0.0.1:5432/postgres", autocommit=True)
r = {}
conn = None
dbname = None


def find_db():
    row = admin.execute(
        "SELECT datname, count(*) FROM pg_stat_activity WHERE datname LIKE '%%bench%%' "
        "GROUP BY 1 ORDER BY 2 DESC LIMIT 1"
    ).fetchone()
    return row[0] if row else None


def classify(p):
    try:
        cmd = " ".join(p.cmdline())
    except Exception:
        return None
    if p.name().startswith("postgres"):
        return "postgres"
    if "redis-server" in cmd:
        return "redis"
    if "celery" in cmd and "timers" in cmd:
        return "timers"
    if "celery" in cmd and "beat" in cmd:
        return "beat"
    if "celery" in cmd:
        return "worker"
    if "gunicorn" in cmd:
        return "web"
    if "bench" in cmd:
        return "bench"
    return None


procs = {}
prev_cpu = {}
prev = {}
while True:
    t = time.time()
    rec = {"t": round(t, 3)}
    if dbname is None:
        dbname = find_db()
        if dbname:
            conn = psycopg.connect(f"postgres://postgres@127.0.0.1:5432/{dbname}", autocommit=True)
    # CPU per category
    cpu = {}
    for p in psutil.process_iter():
        if p.pid not in procs:
            procs[p.pid] = (p, classify(p))
        proc, cat = procs[p.pid]
        if not cat:
            continue
        try:
            ct = proc.cpu_times()
            cpu[cat] = cpu.get(cat, 0) + ct.user + ct.system
        except psutil.Error:  # the process exited
            continue
    rec["cpu"] = {k: round(v - prev_cpu.get(k, v), 3) for k, v in cpu.items()}
    prev_cpu = {**prev_cpu, **cpu}
    bg = admin.execute(
        "SELECT checkpoints_timed, checkpoints_req, buffers_checkpoint, buffers_clean, "
        "buffers_backend, buffers_backend_fsync, buffers_alloc FROM pg_stat_bgwriter"
    ).fetchone()
    rec["bgwriter"] = bg
    rec["wal_lsn"] = admin.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0]
    if conn is not None:
        try:
            rec["activity"] = conn.execute(
                "SELECT coalesce(wait_event_type || ':' || wait_event, state), count(*) "
                "FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND state <> 'idle' GROUP BY 1"
            ).fetchall()
            rec["oldest_xact_s"] = conn.execute(
                "SELECT extract(epoch FROM max(now() - xact_start)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND xact_start IS NOT NULL"
            ).fetchone()[0]
            rec["table"] = conn.execute(
                "SELECT n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, seq_scan, idx_scan, "
                "pg_relation_size('payments_payment') FROM pg_stat_user_tables "
                "WHERE relname = 'payments_payment'"
            ).fetchone()
            rec["db"] = conn.execute(
                "SELECT xact_commit, xact_rollback, blks_read, blks_hit, tup_fetched, "
                "tup_updated, deadlocks, temp_bytes FROM pg_stat_database "
                "WHERE datname = current_database()"
            ).fetchone()
            rec["overdue"] = conn.execute(
                "SELECT status, count(*), extract(epoch FROM now() - min(due_at)) "
                "FROM payments_payment WHERE status IN ('PENDING', 'QUEUED') "
                "AND due_at < now() - interval '250 milliseconds' GROUP BY 1"
            ).fetchall()
            rec["idx"] = conn.execute(
                "SELECT indexrelname, idx_scan, idx_tup_read, idx_tup_fetch "
                "FROM pg_stat_user_indexes WHERE relname = 'payments_payment'"
            ).fetchall()
        except Exception as exc:  # the database went away between steps
            rec["error"] = repr(exc)
            dbname = None
    # redis list lengths over dbs 0-15
    lens = {}
    for n in range(16):
        if n not in r:
            r[n] = redis.Redis(db=n)
        try:
            for key in r[n].scan_iter(count=1000):
                if r[n].type(key) == b"list":
                    lens[f"{n}:{key.decode()}"] = r[n].llen(key)
        except redis.RedisError as exc:
            rec.setdefault("redis_errors", []).append(repr(exc))
    rec["queues"] = {k: v for k, v in lens.items() if v}
    rec["sample_s"] = round(time.time() - t, 3)
    out.write(json.dumps(rec, default=str) + "\n")
    time.sleep(max(0, 1 - (time.time() - t)))
