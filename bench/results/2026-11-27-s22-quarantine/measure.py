"""What the executor's quarantine costs a collapse (session 22). Run against a
database holding payments (``bench/executor_cost.py`` leaves one):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/scheduler_bench_execcost \
      SECRET_KEY=x DJANGO_SETTINGS_MODULE=scheduler_project.settings.base \
      .venv/bin/python bench/results/2026-11-27-s22-quarantine/measure.py
"""

import time
import uuid

import django

django.setup()

from django.db import transaction  # noqa: E402

from payments import locks  # noqa: E402
from payments.clock import db_now  # noqa: E402
from payments.engine.executor import Quarantine  # noqa: E402

ids = [str(uuid.uuid4()) for _ in range(20000)]
quarantine = Quarantine()
quarantine.add([(pid, n % 16) for n, pid in enumerate(ids)], 600)
started = time.perf_counter()
for _ in range(200):
    kept, sent = quarantine.collapsible([3])
print(
    f"collapsible([3]), 20,000 over 16 partitions: {(time.perf_counter() - started) * 5:.3f} ms"
    f" -> partitions {kept}, {len(sent)} ids"
)
now = db_now()
for n in (0, 1000, 20000):
    wall = cpu = 1e9
    for _ in range(7):
        with transaction.atomic():
            w, c = time.perf_counter(), time.process_time()
            locks.lock_due_queued([3], now=now, limit=600, exclude=ids[:n])
            wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    print(f"lock_due_queued, {n} excluded: wall {wall * 1000:.2f} ms, CPU {cpu * 1000:.2f} ms")
