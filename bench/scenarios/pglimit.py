"""pglimit: the physical limit of the same PostgreSQL, measured with ``pgbench``.

``pgbench`` runs a PL/pgSQL double-entry transfer (entry, two postings, two
balance updates, under the same triggers as the service), one per transaction
and 200 per transaction, on the service's own tables.
"""

from __future__ import annotations

import os
import subprocess

from bench.harness.db import prepare
from bench.harness.load import fund_accounts

DATABASE = "scheduler_bench_pglimit"
REDIS_DB = 8


_PG_FUNCTIONS = """
CREATE OR REPLACE FUNCTION bench_transfer(a bigint, b bigint, amt bigint) RETURNS void AS $$
DECLARE eid bigint; ba bigint; bb bigint;
BEGIN
    PERFORM 1 FROM ledger_account WHERE id IN (a, b) ORDER BY id FOR NO KEY UPDATE;
    UPDATE ledger_account SET balance = balance - amt, version = version + 1,
           updated_at = now() WHERE id = a RETURNING balance INTO ba;
    UPDATE ledger_account SET balance = balance + amt, version = version + 1,
           updated_at = now() WHERE id = b RETURNING balance INTO bb;
    INSERT INTO ledger_journalentry (kind, reference, description)
         VALUES ('transfer', 'pgbench:' || gen_random_uuid(), 'pgbench') RETURNING id INTO eid;
    INSERT INTO ledger_posting (entry_id, account_id, amount, balance_after)
         VALUES (eid, a, -amt, ba), (eid, b, amt, bb);
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION bench_transfer_batch(lo bigint, hi bigint, n int) RETURNS void AS $$
DECLARE a bigint[]; b bigint[]; i int;
BEGIN
    -- n random distinct pairs; lock every account of the batch in id order
    -- first (as the service's executor does), so batches never deadlock.
    SELECT array_agg(x), array_agg(lo + ((x - lo + 1 + floor(random() * (hi - lo))::bigint)
                                        % (hi - lo + 1)))
      INTO a, b
      FROM (SELECT lo + floor(random() * (hi - lo + 1))::bigint AS x
              FROM generate_series(1, n)) s;
    PERFORM 1 FROM ledger_account WHERE id = ANY(a || b) ORDER BY id FOR NO KEY UPDATE;
    FOR i IN 1..n LOOP
        PERFORM bench_transfer(a[i], b[i], 1);
    END LOOP;
END $$ LANGUAGE plpgsql;
"""


def _pgbench(url: str, script: str, seconds: int, clients: int) -> float:
    """Run pgbench with ``script``; return transactions per second (excluding connect)."""
    import re
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as handle:
        handle.write(script)
    out = subprocess.run(
        [
            "pgbench",
            "-n",
            "-c",
            str(clients),
            "-j",
            str(clients),
            "-T",
            str(seconds),
            "-f",
            handle.name,
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    os.unlink(handle.name)
    return float(re.search(r"tps = ([\d.]+)", out).group(1))


def run(args) -> dict:
    prepare(DATABASE, REDIS_DB)
    from django.db import connection

    accounts = fund_accounts(1000, 10**12)
    with connection.cursor() as cursor:
        cursor.execute(_PG_FUNCTIONS)
    url = os.environ["DATABASE_URL"].replace("postgres://", "postgresql://")
    lo, hi = min(accounts), max(accounts)
    single = _pgbench(
        url,
        f"\\set a random({lo}, {hi})\n\\set b random({lo}, {hi})\n"
        f"SELECT bench_transfer(:a, CASE WHEN :a = :b THEN {lo} + ((:b - {lo} + 1) % {hi - lo + 1})"
        " ELSE :b END, 1);\n",
        args.pgbench_seconds,
        clients=2,
    )
    batch = 200
    batched = _pgbench(
        url, f"SELECT bench_transfer_batch({lo}, {hi}, {batch});\n", args.pgbench_seconds, 2
    )
    from bench.harness.app import reconcile

    return {
        "clients": 2,
        "seconds": args.pgbench_seconds,
        "single_transfers_per_second": round(single, 1),
        "batched_transfers_per_second": round(batched * batch, 1),
        "batch_size": batch,
        "work_per_transfer": "lock 2 accounts, 2 balance updates, 1 entry, 2 postings "
        "(same tables, constraints and balance triggers as the service)",
        "reconcile_ok": reconcile().ok,
    }
