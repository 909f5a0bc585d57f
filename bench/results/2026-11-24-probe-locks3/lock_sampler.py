"""Sample lock waits every 100 ms, each backend labelled web/worker/... by its client port.

    .venv/bin/python lock_sampler.py DATABASE SECONDS

Prints the average number of backends in each (kind, state, wait type), then
the lock waits as waiter <- first blocker (kind, state, query).
"""

import collections
import sys
import time

import psutil
import psycopg

QUERY = """
SELECT pid, client_port, coalesce(wait_event_type, 'CPU'),
       left(regexp_replace(query, '\\s+', ' ', 'g'), 50), state, pg_blocking_pids(pid)
  FROM pg_stat_activity
 WHERE datname = %s AND pid <> pg_backend_pid()
"""


def kind_of(cmd: str) -> str:
    if "gunicorn" in cmd:
        return "web"
    for needle, kind in (("timer", "timers"), (" beat", "beat"), ("celery", "worker")):
        if needle in cmd:
            return kind
    return "other"


def main() -> None:
    db, seconds = sys.argv[1], float(sys.argv[2])
    conn = psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{db}", autocommit=True)
    kinds: dict[int, str] = {}

    def kind_of_port(port):
        if port not in kinds:  # a new connection: map every client port again
            for c in psutil.net_connections(kind="tcp"):
                if c.laddr and c.raddr and c.raddr.port == 5432 and c.pid:
                    try:
                        cmd = " ".join(psutil.Process(c.pid).cmdline())
                    except psutil.Error:
                        cmd = "?"
                    kinds[c.laddr.port] = kind_of(cmd)
        return kinds.get(port, "?")

    waits: collections.Counter = collections.Counter()
    states: collections.Counter = collections.Counter()
    samples = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        rows = conn.execute(QUERY, (db,)).fetchall()
        samples += 1
        by_pid = {r[0]: r for r in rows}
        for _pid, port, wait, _query, state, blockers in rows:
            kind = kind_of_port(port)
            states[(kind, state, wait)] += 1
            if wait == "Lock":
                for blocker in blockers[:1]:
                    b = by_pid.get(blocker)
                    b_kind = kind_of_port(b[1]) if b else "?"
                    b_state, b_query = (b[4], b[3][:40]) if b else ("?", "?")
                    waits[(kind, _query[:40], "<-", b_kind, b_state, b_query)] += 1
        time.sleep(0.1)
    print("samples", samples)
    print("-- states (avg backends)")
    for key, count in states.most_common(20):
        print(f"{count / samples:7.3f}", key)
    print("-- lock waits: waiter <- first blocker (avg backends)")
    for key, count in waits.most_common(20):
        print(f"{count / samples:7.3f}", key)


if __name__ == "__main__":
    main()
