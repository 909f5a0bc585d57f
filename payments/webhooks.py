"""Signed webhooks with a transactional outbox.

``emit`` is called inside the transaction that changes a payment or schedule;
it inserts one ``WebhookDelivery`` per subscribed endpoint. A rolled-back
transaction therefore leaves nothing to send. After commit the delivery task
is enqueued; a beat task also re-sends any pending delivery whose time has
come, so a lost broker message only delays a webhook.

Each request carries::

    Webhook-Id: <delivery id>              (stable across retries: dedupe on it)
    Webhook-Timestamp: <unix seconds>
    Webhook-Signature: v1=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>

Non-2xx answers and network errors are retried with exponential backoff
(``WEBHOOK_BACKOFF_SECONDS`` · 2^(n-1), capped at one hour) up to
``WEBHOOK_MAX_ATTEMPTS``; every try is logged in ``WebhookAttempt``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from .models import DeliveryStatus, WebhookAttempt, WebhookDelivery, WebhookEndpoint

logger = logging.getLogger(__name__)

EVENT_TYPES = (
    "payment.completed",
    "payment.failed",
    "payment.cancelled",
    "recurring.occurrence_failed",
    "recurring.paused",
)


def new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


def sign(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "v1=" + digest.hexdigest()


def verify(secret: str, timestamp: str, body: bytes, signature: str, tolerance: int = 300) -> bool:
    """What a receiver does: recompute and compare in constant time, reject stale timestamps."""
    if abs(time.time() - int(timestamp)) > tolerance:
        return False
    return hmac.compare_digest(sign(secret, int(timestamp), body), signature)


def emit(events: Iterable[tuple[int, str, dict]]) -> list[WebhookDelivery]:
    """Queue ``(client_id, event_type, data)`` events for every subscribed endpoint.

    Call inside the transaction that made the change; delivery starts after commit.
    """
    events = list(events)
    if not events:
        return []
    clients = {client_id for client_id, _, _ in events}
    endpoints: dict[int, list[WebhookEndpoint]] = {}
    for endpoint in WebhookEndpoint.objects.filter(client_id__in=clients, is_active=True):
        endpoints.setdefault(endpoint.client_id, []).append(endpoint)
    if not endpoints:
        return []
    now = timezone.now()
    deliveries = []
    for client_id, event_type, data in events:
        for endpoint in endpoints.get(client_id, ()):
            if event_type not in endpoint.event_types:
                continue
            delivery = WebhookDelivery(endpoint=endpoint, event_type=event_type)
            delivery.payload = {
                "id": str(delivery.id),
                "type": event_type,
                "created_at": now.isoformat(),
                "data": data,
            }
            deliveries.append(delivery)
    if deliveries:
        WebhookDelivery.objects.bulk_create(deliveries)
        ids = [str(d.pk) for d in deliveries]
        transaction.on_commit(lambda: _enqueue(ids))
    return deliveries


def _enqueue(delivery_ids: list[str]) -> None:
    from .tasks import deliver_webhook

    for delivery_id in delivery_ids:
        try:
            deliver_webhook.apply_async(args=[delivery_id], queue="webhooks")
        except Exception:  # broker down: the beat retry task will pick it up
            logger.warning("could not enqueue webhook %s", delivery_id, exc_info=True)


def backoff(attempts: int) -> timedelta:
    return timedelta(seconds=min(settings.WEBHOOK_BACKOFF_SECONDS * 2 ** (attempts - 1), 3600))


def _claim(delivery_id) -> WebhookDelivery | None:
    """Lock a due pending delivery and push its next attempt out (a short lease)."""
    with transaction.atomic():
        delivery = (
            WebhookDelivery.objects.select_for_update(no_key=True, skip_locked=True)
            .select_related("endpoint")
            .filter(pk=delivery_id, status=DeliveryStatus.PENDING)
            .first()
        )
        if delivery is None or delivery.next_attempt_at > timezone.now():
            return None
        delivery.attempts += 1
        delivery.next_attempt_at = timezone.now() + timedelta(
            seconds=settings.WEBHOOK_TIMEOUT_SECONDS * 2
        )
        delivery.save(update_fields=["attempts", "next_attempt_at"])
    return delivery


def deliver(delivery_id) -> str | None:
    """Try one delivery now if it is due; returns its status afterwards (None if not due)."""
    delivery = _claim(delivery_id)
    if delivery is None:
        return None
    body = json.dumps(delivery.payload, separators=(",", ":"), sort_keys=True).encode()
    timestamp = int(time.time())
    request = urllib.request.Request(  # noqa: S310 - URL scheme validated at registration
        delivery.endpoint.url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "delayed-payment-scheduler-webhooks/1",
            "Webhook-Id": str(delivery.pk),
            "Webhook-Timestamp": str(timestamp),
            "Webhook-Signature": sign(delivery.endpoint.secret, timestamp, body),
        },
    )
    started = time.monotonic()
    status_code, error = None, ""
    try:
        with urllib.request.urlopen(request, timeout=settings.WEBHOOK_TIMEOUT_SECONDS) as resp:  # noqa: S310
            status_code = resp.status
    except urllib.error.HTTPError as exc:
        status_code = exc.code
    except (urllib.error.URLError, OSError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:255]
    duration_ms = int((time.monotonic() - started) * 1000)
    ok = status_code is not None and 200 <= status_code < 300
    with transaction.atomic():
        WebhookAttempt.objects.create(
            delivery=delivery,
            number=delivery.attempts,
            status_code=status_code,
            error=error,
            duration_ms=duration_ms,
        )
        delivery.last_status_code = status_code
        delivery.last_error = error or ("" if ok else f"HTTP {status_code}")
        if ok:
            delivery.status = DeliveryStatus.SUCCEEDED
            delivery.delivered_at = timezone.now()
        elif delivery.attempts >= settings.WEBHOOK_MAX_ATTEMPTS:
            delivery.status = DeliveryStatus.FAILED
        else:
            delivery.next_attempt_at = timezone.now() + backoff(delivery.attempts)
        delivery.save(
            update_fields=[
                "status",
                "delivered_at",
                "next_attempt_at",
                "last_status_code",
                "last_error",
            ]
        )
    from . import metrics

    metrics.webhook_deliveries.labels(outcome="succeeded" if ok else "failed_attempt").inc()
    return delivery.status


def due_delivery_ids(limit: int = 500) -> list[str]:
    ids = WebhookDelivery.objects.filter(
        status=DeliveryStatus.PENDING, next_attempt_at__lte=timezone.now()
    ).order_by("next_attempt_at")
    return [str(pk) for pk in ids.values_list("pk", flat=True)[:limit]]


def payment_data(payment) -> dict:
    def iso(value):
        return value.isoformat() if value else None

    return {
        "payment_id": str(payment.pk),
        "status": payment.status,
        "from_account_id": payment.from_account_id,
        "to_account_id": payment.to_account_id,
        "amount": payment.amount,
        "scheduled_time": iso(payment.due_at),
        "executed_at": iso(payment.executed_at),
        "cancelled_at": iso(payment.cancelled_at),
        "error_code": payment.error_code or None,
        "recurring_payment_id": str(payment.recurring_id) if payment.recurring_id else None,
    }


# --- endpoint services ------------------------------------------------------------


def endpoint_create(*, client, url: str, event_types: list[str]) -> WebhookEndpoint:
    return WebhookEndpoint.objects.create(
        client=client, url=url, secret=new_secret(), event_types=sorted(set(event_types))
    )


def endpoint_get(*, client, endpoint_id) -> WebhookEndpoint:
    from .exceptions import NotFound

    endpoint = WebhookEndpoint.objects.filter(client=client, pk=endpoint_id).first()
    if endpoint is None:
        raise NotFound(f"Webhook endpoint {endpoint_id} not found.")
    return endpoint


def endpoint_update(*, client, endpoint_id, **changes) -> WebhookEndpoint:
    with transaction.atomic():
        endpoint = endpoint_get(client=client, endpoint_id=endpoint_id)
        if "event_types" in changes:
            changes["event_types"] = sorted(set(changes["event_types"]))
        for name, value in changes.items():
            setattr(endpoint, name, value)
        endpoint.save(update_fields=list(changes))
    return endpoint


def endpoint_delete(*, client, endpoint_id) -> None:
    endpoint_get(client=client, endpoint_id=endpoint_id).delete()
