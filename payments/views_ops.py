"""Operations endpoints: /healthz, /readyz, /metrics and the admin operations page."""

from __future__ import annotations

import functools
import hmac
import ipaddress
import os
import threading
import time

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.http import HttpResponse, HttpResponseForbidden, JsonResponse
from django.template.response import TemplateResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from . import ops

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
        from kombu import Connection

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
        from prometheus_client import multiprocess

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


def _bars(values: list[int], height: int = 120, width: int = 720) -> list[dict]:
    """Bar geometry for a server-rendered SVG chart (no JavaScript, no CDN)."""
    peak = max(values) if values and max(values) > 0 else 1
    step = width / max(len(values), 1)
    return [
        {
            "x": round(i * step, 1),
            "w": round(max(step - 1, 1), 1),
            "h": round(v / peak * height, 1),
            "y": round(height - v / peak * height, 1),
            "v": v,
        }
        for i, v in enumerate(values)
    ]


@staff_member_required
def operations(request):
    if not request.user.has_perm("payments.view_payment"):
        raise PermissionDenied
    from django.contrib import admin

    backlog = ops.backlog_by_bucket()
    per_minute = ops.outcomes_per_minute(60)
    executed = [row["executed"] for row in per_minute]
    failed = [row["failed"] for row in per_minute]
    total_executed, total_failed = sum(executed), sum(failed)
    context = {
        **admin.site.each_context(request),
        "title": "Operations",
        "backlog": backlog,
        "backlog_bars": [
            {**bar, "label": label}
            for bar, label in zip(_bars(list(backlog.values()), width=500), backlog, strict=True)
        ],
        "executed_bars": _bars(executed),
        "failed_bars": _bars(failed),
        "total_executed": total_executed,
        "total_failed": total_failed,
        "failure_rate": (
            round(100 * total_failed / (total_executed + total_failed), 2)
            if total_executed + total_failed
            else None
        ),
        "lateness": ops.lateness_percentiles(1),
        "dead_letters": ops.dead_letter_count(),
        "queue_depths": ops.queue_depths(),
        "last_reconciliation": ops.last_reconciliation(),
        "partitions": settings.PAYMENT_PARTITIONS,
    }
    return TemplateResponse(request, "admin/operations.html", context)
