"""Targeted mutants of issue 19's collapse and adaptive chunking, planted one at a time.

    .venv/bin/python scripts/plant_collapse.py   # from a checkout nobody edits (it rewrites files)

Each plant rewrites one guard of ``locks.lock_due_queued``, the executor's
collapse, ``sweeper.chunk_claims`` or the sweep task, runs the engine tests
against it, restores the file, and prints KILLED (a test failed) or SURVIVED.
A stop-gap for the full ``scripts/mutation`` runs of these modules (about an
hour); results in docs/mutation-testing.md.
"""

import os
import subprocess
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
plants = [
    ("payments/locks.py", "due_at__lte=now,", "", "collapse: drop the due check"),
    ("payments/locks.py", "lease_expires_at__gt=now,", "", "collapse: drop the live-lease check"),
    (
        "payments/locks.py",
        "status=PaymentStatus.QUEUED,\n            partition__in",
        "partition__in",
        "collapse: drop QUEUED",
    ),
    ("payments/locks.py", "partition__in=list(partitions),", "", "collapse: any partition"),
    ("payments/locks.py", "attempts=1,", "", "collapse: payments claimed again too"),
    (
        "payments/tasks.py",
        "countdown=backoff_seconds(retries), kwargs={})",
        "countdown=backoff_seconds(retries))",
        "retries collapse too",
    ),
    (
        "payments/locks.py",
        ".exclude(pk__in=list(exclude))",
        "",
        "collapse: chunk's own ids not excluded",
    ),
    (
        "payments/locks.py",
        'order_by("due_at")[:limit]',
        'order_by("due_at")[: limit + 1]',
        "collapse: limit + 1",
    ),
    (
        "payments/engine/executor.py",
        "if partitions and room > 0:",
        "if partitions and room >= 0:",
        "room >= 0",
    ),
    (
        "payments/engine/executor.py",
        "room = settings.PAYMENT_CHUNK_SIZE - len(due)",
        "room = settings.PAYMENT_CHUNK_SIZE",
        "room ignores the chunk",
    ),
    (
        "payments/engine/executor.py",
        "result.collapsed.extend(str(p.pk) for p in more)",
        "result.collapsed.extend([])",
        "collapsed not reported",
    ),
    (
        "payments/engine/sweeper.py",
        "claim.due_at - current[0].due_at > spread",
        "claim.due_at - current[0].due_at >= spread",
        "spread >=",
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
        "busy = busy or result.backpressure",
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
for path, old, new, label in plants:
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
