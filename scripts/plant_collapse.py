"""Targeted mutants of issue 19's collapse, adaptive chunking and claim grid, planted one at a time.

    .venv/bin/python scripts/plant_collapse.py   # from a checkout nobody edits (it rewrites files)
    .venv/bin/python scripts/plant_collapse.py collapse: grid   # only plants whose label has one

Each plant rewrites one guard of ``locks.lock_due_queued``, the executor's
collapse, ``sweeper.chunk_claims``, ``routing.chunk_partition``, the claim
grid (``clock``, ``claim_due``, ``sweeper.work_ahead``) or the sweep task,
runs the engine tests
against it, restores the file, and prints KILLED (a test failed) or SURVIVED.
A stop-gap for the full ``scripts/mutation`` runs of these modules (about an
hour); results in docs/mutation-testing.md.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
plants = [
    # The collapse's lock is SQL of its own on PostgreSQL, where these run
    # (session 14); its ORM form is SQLite's, mutated by scripts/mutation's
    # SQLite pass. Each plant keeps the statement's parameters.
    (
        "payments/locks.py",
        "   AND due_at <= %b\n",
        "   AND (due_at <= %b OR true)\n",
        "collapse: drop the due check",
    ),
    (
        "payments/locks.py",
        "   AND lease_expires_at > %b\n",
        "   AND (lease_expires_at > %b OR true)\n",
        "collapse: drop the live-lease check",
    ),
    (
        "payments/locks.py",
        " WHERE status = 'QUEUED'\n   AND partition",
        " WHERE status IS NOT NULL\n   AND partition",
        "collapse: drop QUEUED",
    ),
    (
        "payments/locks.py",
        "   AND partition = ANY(%b::integer[])\n",
        "   AND (partition = ANY(%b::integer[]) OR true)\n",
        "collapse: any partition",
    ),
    (
        "payments/locks.py",
        "   AND attempts = 1\n",
        "   AND attempts >= 1\n",
        "collapse: payments claimed again too",
    ),
    (
        "payments/tasks.py",
        "countdown=backoff_seconds(retries), kwargs={})",
        "countdown=backoff_seconds(retries))",
        "retries collapse too",
    ),
    (
        "payments/locks.py",
        "   AND NOT (id = ANY(%b::uuid[]))\n",
        "   AND (NOT (id = ANY(%b::uuid[])) OR true)\n",
        "collapse: chunk's own ids not excluded",
    ),
    (
        "payments/locks.py",
        " LIMIT %b\n   FOR NO KEY UPDATE SKIP LOCKED",
        " LIMIT %b + 1\n   FOR NO KEY UPDATE SKIP LOCKED",
        "collapse: limit + 1",
    ),
    (
        "payments/engine/executor.py",
        "limit=settings.PAYMENT_COLLAPSE_LIMIT, exclude",
        "limit=settings.PAYMENT_COLLAPSE_LIMIT - len(due), exclude",
        "collapse room shrinks as the chunk fills (the cap before session 18)",
    ),
    (
        "payments/engine/executor.py",
        "limit=settings.PAYMENT_COLLAPSE_LIMIT, exclude",
        "limit=settings.PAYMENT_CHUNK_SIZE, exclude",
        "collapse limit is the chunk size",
    ),
    (
        "payments/engine/executor.py",
        "    if partitions:  # step 3",
        "    if partitions and len(due) < settings.PAYMENT_CHUNK_SIZE:  # step 3",
        "a full chunk collapses nothing",
    ),
    (
        "payments/engine/executor.py",
        "    if partitions:  # step 3",
        "    if partitions and due:  # step 3",
        "a message whose own payments ran collapses nothing",
    ),
    (
        "payments/engine/executor.py",
        "result.collapsed.extend(str(p.pk) for p in more)",
        "result.collapsed.extend([])",
        "collapsed not reported",
    ),
    (
        "payments/routing.py",
        "return claims[_spread(claims[0].payment_id, len(claims))].partition",
        "return claims[0].partition",
        "a chunk goes on its first payment's partition's queue (its lowest)",
    ),
    (
        "payments/clock.py",
        "return later - first <= timedelta(",
        "return later - first < timedelta(",
        "no grid: spread <",
    ),
    (
        "payments/clock.py",
        "return slot_start(first, grid) == slot_start(later, grid)",
        "return later - first < grid",
        "grid: window from its first claim",
    ),
    (
        "payments/clock.py",
        "lookahead < spread.total_seconds()",
        "lookahead <= spread.total_seconds()",
        "grid: a lookahead of one slot is not enough",
    ),
    (
        "payments/clock.py",
        "spread <= timedelta(0) or",
        "spread < timedelta(0) or",
        "grid: a spread of 0",
    ),
    (
        "payments/transitions.py",
        "    grid = spread_grid(lookahead)\n",
        "    grid = spread_grid()\n",
        "claim: the grid of the configured lookahead, not the claim's",
    ),
    (
        "payments/transitions.py",
        "    grid = spread_grid(lookahead)\n",
        "    grid = None\n",
        "claim: horizon not rounded to a slot",
    ),
    (
        "payments/transitions.py",
        'cutoff=f"run_at < date_bin(',
        'cutoff=f"run_at <= date_bin(',
        "claim: a payment at a slot's start claimed with the slot before",
    ),
    (
        "payments/transitions.py",
        '{"run_at__lt": slot_start(',
        '{"run_at__lte": slot_start(',
        "claim (ORM): a payment at a slot's start claimed with the slot before",
    ),
    (
        "payments/engine/sweeper.py",
        "not same_slot(current[0].due_at, claim.due_at, grid)",
        "not same_slot(current[-1].due_at, claim.due_at, grid)",
        "window measured from its last claim",
    ),
    (
        "payments/engine/sweeper.py",
        "ahead = settings.PAYMENT_LOOKAHEAD_SECONDS + grid.total_seconds()",
        "ahead = settings.PAYMENT_LOOKAHEAD_SECONDS",
        "work ahead: the next slot not looked at",
    ),
    (
        "payments/engine/sweeper.py",
        "    if not result.claimed and not result.backpressure:\n        result.work_ahead",
        "    if False:\n        result.work_ahead",
        "work ahead never looked for",
    ),
    (
        "payments/tasks.py",
        " or result.work_ahead\n",
        "\n",
        "sweep does not tick while a slot fills",
    ),
    (
        "payments/engine/sweeper.py",
        "if len(batch) + len(piece) > size:",
        "if len(batch) + len(piece) >= size:",
        "pack >=",
    ),
    (
        "payments/engine/sweeper.py",
        "chunks.append((partitions, max(c.due_at for c in batch), batch))",
        "chunks.append((partitions, min(c.due_at for c in batch), batch))",
        "eta = earliest",
    ),
    (
        "payments/engine/sweeper.py",
        "waits = now is None or claim.due_at > now",
        "waits = True",
        "overdue split by spread",
    ),
    (
        "payments/tasks.py",
        'kwargs={"partitions": list(partitions)},',
        "",
        "sweeper messages without partitions",
    ),
    (
        "payments/tasks.py",
        "busy = busy or bool(result.claimed) or result.backpressure",
        "busy = busy or False or result.backpressure",
        "sweep does not tick after claiming",
    ),
]
tests = [
    "tests/payments/engine/test_collapse.py",
    "tests/payments/engine/test_sweeper.py",
    "tests/payments/engine/test_sweeper_contract.py",
    "tests/payments/engine/test_executor.py",
]
env = {
    **os.environ,
    "PYTHONPATH": ROOT,  # its own database and Redis db
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/scheduler_plant19",
    "CELERY_BROKER_URL": "redis://127.0.0.1:6379/13",
    "SECRET_KEY": "x",
}
chosen = sys.argv[1:]
for path, old, new, label in plants:
    if chosen and not any(word in label for word in chosen):
        continue
    full = Path(ROOT, path)
    src = full.read_text()
    if old not in src:
        print(f"?? {label}: pattern not found")
        continue
    full.write_text(src.replace(old, new, 1))
    try:
        r = subprocess.run(
            [
                os.path.join(ROOT, ".venv/bin/python"),
                "-m",
                "pytest",
                *tests,
                "-x",
                "-q",
                "-p",
                "no:randomly",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-200:]
        print(
            ("KILLED  " if r.returncode == 1 else f"SURVIVED(rc={r.returncode}) ")
            + label
            + " | "
            + last,
            flush=True,
        )
    finally:
        full.write_text(src)
