"""Operations: figures for the operations page and Prometheus, health checks.

All figures come from PostgreSQL (the truth) or the broker, computed when
asked; nothing here needs a process to have been running to be right.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import redis
from django.conf import settings
from django.db import connection
from django.db.models import Count, Q
from django.db.models.functions import TruncMinute
from prometheus_client.core import GaugeMetricFamily

from ledger.models import ReconciliationRun

from .clock import db_now
from .models import DEAD_LETTER_CODE, Payment, PaymentStatus
from .routing import queue_name

logger = logging.getLogger(__name__)

BUCKETS = ("overdue", "< 1 min", "< 1 h", "< 1 day", "later")


def backlog_by_bucket() -> dict[str, int]:
    """Open (PENDING or QUEUED) payments by how soon they are due."""
    now = db_now()
    open_ = Q(status__in=[PaymentStatus.PENDING, PaymentStatus.QUEUED])
    counts = Payment.objects.filter(open_).aggregate(
        overdue=Count("pk", filter=Q(due_at__lt=now)),
        minute=Count("pk", filter=Q(due_at__gte=now, due_at__lt=now + timedelta(minutes=1))),
        hour=Count(
            "pk",
            filter=Q(due_at__gte=now + timedelta(minutes=1), due_at__lt=now + timedelta(hours=1)),
        ),
        day=Count(
            "pk", filter=Q(due_at__gte=now + timedelta(hours=1), due_at__lt=now + timedelta(days=1))
        ),
        later=Count("pk", filter=Q(due_at__gte=now + timedelta(days=1))),
    )
    return dict(zip(BUCKETS, counts.values(), strict=True))


def outcomes_per_minute(minutes: int = 60) -> list[dict]:
    """Executed and failed payments per minute over the last ``minutes``."""
    now = db_now()
    since = now - timedelta(minutes=minutes)
    executed = dict(
        Payment.objects.filter(status=PaymentStatus.COMPLETED, executed_at__gte=since)
        .annotate(minute=TruncMinute("executed_at"))
        .values_list("minute")
        .annotate(n=Count("pk"))
        .values_list("minute", "n")
    )
    failed = dict(
        Payment.objects.filter(status=PaymentStatus.FAILED, updated_at__gte=since)
        .annotate(minute=TruncMinute("updated_at"))
        .values_list("minute")
        .annotate(n=Count("pk"))
        .values_list("minute", "n")
    )
    start = since.replace(second=0, microsecond=0) + timedelta(minutes=1)
    rows = []
    for i in range(minutes):
        minute = start + timedelta(minutes=i)
        rows.append(
            {"minute": minute, "executed": executed.get(minute, 0), "failed": failed.get(minute, 0)}
        )
    return rows


def lateness_percentiles(hours: int = 1) -> dict[str, float | None]:
    """p50/p95/p99 of executed_at - due_at (seconds) over the last ``hours``."""
    since = db_now() - timedelta(hours=hours)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                """
                SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP
                       (ORDER BY extract(epoch FROM executed_at - due_at)), count(*)
                  FROM payments_payment
                 WHERE status = 'COMPLETED' AND executed_at >= %s
                """,
                [since],
            )
            values, n = cursor.fetchone()
        values = values or [None, None, None]
    else:
        rows = sorted(
            (e - d).total_seconds()
            for e, d in Payment.objects.filter(
                status=PaymentStatus.COMPLETED, executed_at__gte=since
            ).values_list("executed_at", "due_at")
        )
        n = len(rows)
        values = [rows[min(n - 1, int(q * n))] if n else None for q in (0.5, 0.95, 0.99)]
    return {
        "p50": _f(values[0]),
        "p95": _f(values[1]),
        "p99": _f(values[2]),
        "count": n,
    }


def _f(value) -> float | None:
    return None if value is None else round(float(value), 4)


def dead_letter_count() -> int:
    return Payment.objects.filter(status=PaymentStatus.FAILED, error_code=DEAD_LETTER_CODE).count()


def queue_depths() -> dict[str, int] | None:
    """Messages waiting per partition queue (Redis broker), None if not measurable."""
    url = settings.CELERY_BROKER_URL
    if not url.startswith(("redis://", "rediss://")):
        return None
    try:
        client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
        pipe = client.pipeline()
        names = [queue_name(n) for n in range(settings.PAYMENT_PARTITIONS)]
        for name in names:
            pipe.llen(name)
        return dict(zip(names, pipe.execute(), strict=True))
    except redis.RedisError:
        logger.warning("queue depth unavailable", exc_info=True)
        return None


def last_reconciliation() -> ReconciliationRun | None:
    return ReconciliationRun.objects.order_by("-started_at").first()


class DatabaseCollector:
    """Prometheus gauges read from the database (the truth, from any process).

    The aggregate queries run over all payments (tenths of a second with a
    million pending), so their result is kept ``METRICS_DB_CACHE_SECONDS`` per
    process: however often /metrics is scraped, the database answers them at
    most once per window. Concurrent scrapes (threads) wait on a lock for the
    one computation in progress instead of running their own. A failed
    computation (database busy or down) is remembered for the window too: the
    gauges are left out of the exposition and the database is not asked again
    by every scrape.
    """

    FAMILIES = (
        ("payments_pending", "PENDING payments", ()),
        ("payments_queued", "QUEUED payments (claimed, leased)", ()),
        ("payments_backlog", "Open payments by due bucket", ("bucket",)),
        ("payments_dead_letters", "Payments FAILED max_attempts_exceeded", ()),
        ("payments_queue_depth", "Messages waiting per partition queue", ("queue",)),
        ("ledger_reconciliation_mismatches", "Mismatches found by the last reconciliation", ()),
        (
            "ledger_reconciliation_last_run_timestamp_seconds",
            "When the last reconciliation started (unix time; 0 if never)",
            (),
        ),
    )

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._computed_at: float | None = None
        self._values: dict | None = None

    def describe(self):
        """Names only, so registering the collector does not query the database."""
        for name, doc, labels in self.FAMILIES:
            yield GaugeMetricFamily(name, doc, labels=list(labels) or None)

    def collect(self):
        values = self.values()
        if values is None:
            return
        for name, doc, labels in self.FAMILIES:
            family = GaugeMetricFamily(name, doc, labels=list(labels) or None)
            for label_values, value in values[name].items():
                family.add_metric(list(label_values), value)
            yield family

    def values(self) -> dict | None:
        """The gauges' values, computed at most once per ``METRICS_DB_CACHE_SECONDS``."""
        with self._lock:
            age = None if self._computed_at is None else self.clock() - self._computed_at
            if age is None or not 0 <= age < settings.METRICS_DB_CACHE_SECONDS:
                self._values = self._compute()
                self._computed_at = self.clock()
            return self._values

    def _compute(self) -> dict | None:
        try:
            backlog = backlog_by_bucket()
            dead = dead_letter_count()
            pending = Payment.objects.filter(status=PaymentStatus.PENDING).count()
            queued = Payment.objects.filter(status=PaymentStatus.QUEUED).count()
            run = last_reconciliation()
            depths = queue_depths() or {}
        except Exception:  # a scrape must not fail because the database is busy
            logger.warning("database metrics unavailable", exc_info=True)
            return None
        return {
            "payments_pending": {(): pending},
            "payments_queued": {(): queued},
            "payments_backlog": {(bucket,): n for bucket, n in backlog.items()},
            "payments_dead_letters": {(): dead},
            "payments_queue_depth": {(name,): n for name, n in depths.items()},
            "ledger_reconciliation_mismatches": {(): run.mismatch_count if run else 0},
            "ledger_reconciliation_last_run_timestamp_seconds": {
                (): run.started_at.timestamp() if run else 0
            },
        }
