"""Operations endpoints: /healthz, /readyz, /metrics and the admin operations page."""

from __future__ import annotations

import functools
import hmac
import ipaddress
import os
import threading
import time

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.http import HttpResponse, HttpResponseForbidden, JsonResponse
from django.template.response import TemplateResponse
from django.utils.formats import date_format
from django.utils.timezone import localtime
from kombu import Connection
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
    multiprocess,
)

from . import formatting, ops
from .clock import db_now

_database_collector = ops.DatabaseCollector()
REGISTRY.register(_database_collector)


def healthz(request):
    """Liveness: the process answers."""
    return JsonResponse({"status": "ok"})


def readyz(request):
    """Readiness: the database and the broker answer (503 naming what does not)."""
    checks = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {type(exc).__name__}"
    try:
        with Connection(
            settings.CELERY_BROKER_URL,
            connect_timeout=2,
            transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS,
        ) as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        checks["broker"] = "ok"
    except Exception as exc:
        checks["broker"] = f"error: {type(exc).__name__}"
    ready = all(v == "ok" for v in checks.values())
    return JsonResponse(
        {"status": "ok" if ready else "unavailable", "checks": checks}, status=200 if ready else 503
    )


@functools.lru_cache(maxsize=8)
def _networks(cidrs: tuple[str, ...]) -> tuple:
    return tuple(ipaddress.ip_network(cidr) for cidr in cidrs)


def metrics_allowed(request) -> bool:
    """``Authorization: Bearer <METRICS_TOKEN>``, or a connection from METRICS_ALLOWED_NETWORKS.

    The address is the connection's (REMOTE_ADDR): X-Forwarded-For is written
    by the client and proves nothing.
    """
    token = settings.METRICS_TOKEN
    if token:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), token.encode()
        ):
            return True
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    if address.version == 6 and address.ipv4_mapped:
        address = address.ipv4_mapped  # a dual-stack socket reports ::ffff:127.0.0.1
    return any(address in net for net in _networks(tuple(settings.METRICS_ALLOWED_NETWORKS)))


def metrics(request):
    """Prometheus exposition: this process, plus every worker/beat/web process on this host
    when ``PROMETHEUS_MULTIPROC_DIR`` is shared, plus database-derived gauges (cached,
    see ``ops.DatabaseCollector``). Only for Prometheus: see ``metrics_allowed``."""
    if not metrics_allowed(request):
        return HttpResponseForbidden(
            "403 Forbidden: /metrics needs Authorization: Bearer <METRICS_TOKEN> "
            "or a source address in METRICS_ALLOWED_NETWORKS.\n",
            content_type="text/plain; charset=utf-8",
        )
    return HttpResponse(_exposition.get(), content_type=CONTENT_TYPE_LATEST)


def render_exposition() -> bytes:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(_database_collector)
    else:
        registry = REGISTRY
    return generate_latest(registry)


class RenderedExposition:
    """The rendered page, reused for ``METRICS_RENDER_CACHE_SECONDS`` per process.

    Concurrent scrapes (gunicorn threads) wait for the one render in progress,
    so rendering costs at most one per window per process whatever the scrape
    rate; a window of 0 renders every time.
    """

    def __init__(self, render=render_exposition, clock=time.monotonic) -> None:
        self.render, self.clock = render, clock
        self._lock = threading.Lock()
        self._body: bytes | None = None
        self._at = 0.0

    def get(self) -> bytes:
        window = settings.METRICS_RENDER_CACHE_SECONDS
        with self._lock:
            now = self.clock()
            if self._body is None or not 0 <= now - self._at < window:
                self._body, self._at = self.render(), now
            return self._body


_exposition = RenderedExposition()


def _nice_ceiling(value: int) -> int:
    """The smallest 1, 2 or 5 x 10^k at or above ``value`` (at least 1): the y-axis top."""
    magnitude = 1
    while True:
        for step in (1, 2, 5):
            if step * magnitude >= value:
                return step * magnitude
        magnitude *= 10


def bar_chart(
    chart_id: str,
    *,
    title: str,
    x_label: str,
    y_label: str,
    values: list[int],
    labels: list[str],
    tooltips: list[str],
    failed: bool = False,
) -> dict:
    """Geometry of a server-rendered bar chart (no JavaScript, no CDN).

    The bars are drawn in an SVG of ``10 x n`` by 100 user units stretched to
    its card's width (``preserveAspectRatio="none"``), so the chart fits any
    window; titles, tick labels and axis labels are HTML text beside it, so
    they keep their size. ``labels`` holds the x tick label of each bar ("" for
    none). Counts are integers, shown with thousands separators.
    """
    top = _nice_ceiling(max(values, default=0))
    ticks = [0, top // 2, top] if top % 2 == 0 else [0, top]
    bars = []
    for i, (value, tooltip) in enumerate(zip(values, tooltips, strict=True)):
        height = round(value / top * 100, 2)
        bars.append(
            {"x": i * 10 + 1, "w": 8, "y": round(100 - height, 2), "h": height, "title": tooltip}
        )
    return {
        "id": chart_id,
        "title": title,
        "x_label": x_label,
        "y_label": y_label,
        "width": 10 * len(values),
        "columns": len(values),
        "bars": bars,
        "failed": failed,
        "y_ticks": [
            {"label": f"{t:,d}", "pct": round(t / top * 100, 2), "y": round(100 - t / top * 100, 2)}
            for t in ticks
        ],
        "x_ticks": [
            {"label": label, "column": i + 1} for i, label in enumerate(labels) if label != ""
        ],
        "total": sum(values),
    }


def _minute_chart(chart_id: str, title: str, rows: list[dict], key: str, **kwargs) -> dict:
    """Per-minute counts of the last hour, oldest first; x ticks every 10 minutes ago."""
    last = len(rows) - 1
    return bar_chart(
        chart_id,
        title=title,
        x_label="minutes ago",
        y_label="payments per minute",
        values=[row[key] for row in rows],
        labels=[str(last - i) if (last - i) % 10 == 0 else "" for i in range(len(rows))],
        tooltips=[
            f"{date_format(localtime(row['minute']), 'DATETIME_FORMAT')}: {row[key]:,d} {key}"
            for row in rows
        ],
        **kwargs,
    )


@staff_member_required
def operations(request):
    """Figures and charts for support (DESIGN §6): every duration in milliseconds with
    one decimal (payments.formatting), every count with thousands separators, every
    time with seconds and its zone."""
    if not request.user.has_perm("payments.view_payment"):
        raise PermissionDenied
    backlog = ops.backlog_by_bucket()
    per_minute = ops.outcomes_per_minute(60)
    total_executed = sum(row["executed"] for row in per_minute)
    total_failed = sum(row["failed"] for row in per_minute)
    lateness = ops.lateness_percentiles(1)
    queue_depths = ops.queue_depths()
    reconciliation = ops.last_reconciliation()
    charts = [
        bar_chart(
            "backlog-chart",
            title="Backlog by due time",
            x_label="due",
            y_label="open payments",
            values=list(backlog.values()),
            labels=list(backlog),
            tooltips=[f"{label}: {value:,d} open payments" for label, value in backlog.items()],
        ),
        _minute_chart("executed-chart", "Executed per minute, last hour", per_minute, "executed"),
        _minute_chart(
            "failed-chart", "Failed per minute, last hour", per_minute, "failed", failed=True
        ),
    ]
    if queue_depths is not None:
        charts.append(
            bar_chart(
                "queues-chart",
                title="Queue depth per partition",
                x_label="partition",
                y_label="messages waiting",
                values=list(queue_depths.values()),
                labels=[f"{n:02d}" for n in range(len(queue_depths))],
                tooltips=[f"{name}: {depth:,d} messages" for name, depth in queue_depths.items()],
            )
        )
    context = {
        **admin.site.each_context(request),
        "title": "Operations",
        "as_of": localtime(db_now()),
        "charts": charts,
        "backlog": backlog,
        "total_executed": total_executed,
        "total_failed": total_failed,
        "failure_rate": (
            f"{100 * total_failed / (total_executed + total_failed):.1f} %"
            if total_executed + total_failed
            else None
        ),
        "lateness": lateness,
        "lateness_ms": {q: formatting.duration_ms(lateness[q]) for q in ("p50", "p95", "p99")},
        "dead_letters": ops.dead_letter_count(),
        "queue_depths": queue_depths,
        "last_reconciliation": reconciliation,
        "reconciliation_duration": (
            formatting.duration_ms(reconciliation.duration_seconds) if reconciliation else None
        ),
        "partitions": settings.PAYMENT_PARTITIONS,
    }
    return TemplateResponse(request, "admin/operations.html", context)
