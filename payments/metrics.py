"""Prometheus metrics of the payment engine (DESIGN §6).

Counters and histograms are process-local; in Celery workers and gunicorn
they are aggregated through prometheus_client's multiprocess mode when
``PROMETHEUS_MULTIPROC_DIR`` is set (see README, Operations). Gauges of state
(pending, backlog, dead letters, queue depth, last reconciliation) are read
from the database at scrape time by ``payments.ops.DatabaseCollector``.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LATENESS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

scheduled = Counter("payments_scheduled_total", "Payments scheduled through the API")
executed = Counter("payments_executed_total", "Payments executed (COMPLETED)")
failed = Counter("payments_failed_total", "Payments FAILED", ["error_code"])
cancelled = Counter("payments_cancelled_total", "Payments cancelled", ["actor"])
stale_deliveries = Counter(
    "payments_stale_deliveries_total", "Chunk items skipped: old fence or no longer QUEUED"
)
busy_items = Counter(
    "payments_chunk_items_busy_total",
    "Chunk items another transaction held, handed back after PAYMENT_BUSY_RETRY_MS",
)
lateness = Histogram(
    "payments_lateness_seconds",
    "executed_at - scheduled time of completed payments",
    buckets=LATENESS_BUCKETS,
)
sweep_duration = Histogram(
    "payments_sweep_duration_seconds",
    "Duration of one sweeper run",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
sweep_batch_size = Histogram(
    "payments_sweep_batch_size",
    "Payments claimed per sweep statement",
    buckets=(1, 10, 50, 100, 250, 500, 1000, 2000, 5000),
)
sweep_runs = Counter("payments_sweep_runs_total", "Sweeper runs")
claims_handed_back = Counter(
    "payments_claims_handed_back_total",
    "Claims handed back to PENDING because their message could not be published",
)
sweep_interval = Histogram(
    "payments_sweep_interval_seconds",
    "Seconds between the starts of consecutive sweeps in one timer process",
    buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.1, 1.25, 1.5, 2, 3, 5, 10),
)
sweep_held_back = Counter(
    "payments_sweep_held_back_total",
    "Sweeper runs that stopped claiming (too many QUEUED, or executors behind)",
)
executor_lag = Gauge(
    "payments_executor_lag_seconds",
    "Executors' queue delay seen by the last sweep (oldest live QUEUED claim)",
    multiprocess_mode="mostrecent",
)
executor_batch_size = Histogram(
    "payments_executor_batch_size",
    "Payments executed per executor transaction (a chunk plus what it collapsed)",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500),
)
collapsed = Counter(
    "payments_collapsed_total",
    "Due QUEUED payments an executor ran in a batch other than their own message's",
)
collapse_quarantined = Counter(
    "payments_collapse_quarantined_total",
    "Payments a failed batch had collapsed, kept out of that worker process's collapses "
    "until their lease ends (one of them may be what broke it)",
)
collapse_skipped = Counter(
    "payments_collapse_skipped_total",
    "Partitions a committed batch left out of its collapse: more of their payments were "
    "kept out (payments_collapse_quarantined_total) than a collapse leaves out at once",
)
reaped = Counter("payments_reaped_leases_total", "Expired leases", ["outcome"])
chunk_retries = Counter(
    "payments_chunk_retries_total", "Executor chunk retries by error class", ["error_class"]
)
chunk_splits = Counter("payments_chunk_splits_total", "Chunks split to isolate a poison payment")
stale_account_reads = Counter(
    "payments_batch_stale_accounts_total",
    "Executor batches run again with accounts locked first: an account read unlocked "
    "changed status or funds before the batch locked it",
)


def record_reap(result) -> None:
    """A lease-reaper run's counts (the beat task and ``manage.py reap_leases``
    alike). A dead letter is a failed payment too: ``payments_failed_total``
    counted only the executor's failures, so the failure-rate alert read 0 %
    while every payment of a partition dead-lettered."""
    from .models import DEAD_LETTER_CODE  # this module is imported before the app registry

    reaped.labels(outcome="requeued").inc(result.requeued)
    reaped.labels(outcome="dead_lettered").inc(result.dead_lettered)
    reaped.labels(outcome="error").inc(result.errors)
    reaped.labels(outcome="timed_out").inc(result.timed_out)
    failed.labels(error_code=DEAD_LETTER_CODE).inc(result.dead_lettered)
    if result.budget_exhausted:
        reaper_budget_exhausted.inc()


def record_chunk(result) -> None:
    executed.inc(len(result.completed))
    for code in result.failure_codes:
        failed.labels(error_code=code).inc()
    for seconds in result.lateness_seconds:
        lateness.observe(max(seconds, 0.0))
    if result.stale:
        stale_deliveries.inc(len(result.stale))
    if result.busy:
        busy_items.inc(len(result.busy))
    if result.collapsed:
        collapsed.inc(len(result.collapsed))
    if result.partitions_not_collapsed:
        collapse_skipped.inc(result.partitions_not_collapsed)
    batch = len(result.completed) + len(result.failed)
    if batch:
        executor_batch_size.observe(batch)


webhook_deliveries = Counter(
    "payments_webhook_deliveries_total", "Webhook delivery attempts by outcome", ["outcome"]
)
recurring_occurrences = Counter(
    "payments_recurring_occurrences_total", "Recurring occurrences handled", ["status"]
)
recurring_errors = Counter(
    "payments_recurring_errors_total",
    "Recurring schedules the materialiser could not handle: paused (parked with a reason), "
    "retry (database error, left for the next run) or dropped (a stopped schedule's "
    "unrecorded occurrences that could not be read)",
    ["outcome"],
)
materialize_duration = Histogram(
    "payments_materialize_duration_seconds",
    "Duration of one materialiser run (time-boxed by RECURRING_MATERIALIZE_BUDGET_SECONDS)",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10),
)
reaper_budget_exhausted = Counter(
    "payments_reaper_budget_exhausted_total",
    "Lease-reaper runs that stopped at their time budget with dead letters left for the next run",
)
materialize_budget_exhausted = Counter(
    "payments_materialize_budget_exhausted_total",
    "Materialiser runs that stopped at their time budget with schedules left for the next run",
)


# HTTP metrics of the web processes (payments.middleware.HttpMetricsMiddleware).
# The names, labels and buckets are django-prometheus's own for these three
# series, so its dashboards and queries keep working; its other request
# series (by transport, charset, body size, …) are not exported.
HTTP_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 25.0, 50.0, 75.0,
)  # fmt: skip
http_requests = Counter(
    "django_http_requests_total_by_view_transport_method",
    "Count of requests by view, transport, method.",
    ["view", "transport", "method"],
)
http_responses = Counter(
    "django_http_responses_total_by_status_view_method",
    "Count of responses by status, view, method.",
    ["status", "view", "method"],
)
http_latency = Histogram(
    "django_http_requests_latency_seconds_by_view_method",
    "Histogram of request processing time (middleware included) labelled by view.",
    ["view", "method"],
    buckets=HTTP_LATENCY_BUCKETS,
)
http_exceptions = Counter(
    "django_http_exceptions_total_by_type",
    "Count of exceptions by object type.",
    ["type"],
)
