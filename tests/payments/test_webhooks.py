"""Signed webhooks delivered to a local HTTP receiver."""

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import transaction
from django.utils import timezone

from payments import services, webhooks
from payments.models import WebhookAttempt, WebhookDelivery
from tests.payments.engine import make_due, sweep
from tests.payments.test_api import error

pytestmark = pytest.mark.django_db


class Receiver:
    """A local HTTP server answering with the queued status codes (then 200)."""

    def __init__(self):
        self.requests = []
        self.answers = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append((dict(self.headers), body))
                self.send_response(receiver.answers.pop(0) if receiver.answers else 200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def register(client, url, events=("payment.completed", "payment.cancelled", "payment.failed")):
    response = client.api.post(
        "/api/v1/webhook-endpoints", {"url": url, "event_types": list(events)}, format="json"
    )
    assert response.status_code == 201, response.content
    return response.json()


def test_endpoint_api_and_isolation(alice, bob):
    created = register(alice, "https://example.test/hooks")
    assert created["secret"].startswith("whsec_")
    eid = created["webhook_endpoint_id"]
    listed = alice.api.get("/api/v1/webhook-endpoints").json()["webhook_endpoints"]
    assert [e["webhook_endpoint_id"] for e in listed] == [eid] and "secret" not in listed[0]
    body = alice.api.patch(
        f"/api/v1/webhook-endpoints/{eid}", {"is_active": False}, format="json"
    ).json()
    assert body["is_active"] is False
    for method in ("get", "patch", "delete"):
        error(
            getattr(bob.api, method)(f"/api/v1/webhook-endpoints/{eid}", {}, format="json"),
            404,
            "not_found",
        )
    error(bob.api.get(f"/api/v1/webhook-endpoints/{eid}/deliveries"), 404, "not_found")
    bad = alice.api.post(
        "/api/v1/webhook-endpoints", {"url": "ftp://x", "event_types": ["nope"]}, format="json"
    )
    assert set(error(bad, 400, "validation_error")["details"]["fields"]) == {"url", "event_types"}
    assert alice.api.delete(f"/api/v1/webhook-endpoints/{eid}").status_code == 204


def test_signed_delivery_the_receiver_can_verify(alice, receiver):
    endpoint = register(alice, receiver.url)
    payment_id = alice.schedule().json()["payment_id"]
    alice.api.delete(f"/api/v1/payments/{payment_id}/cancel")
    (delivery,) = WebhookDelivery.objects.all()
    assert webhooks.deliver(delivery.pk) == "succeeded"
    (headers, body) = receiver.requests[0]
    assert webhooks.verify(
        endpoint["secret"], headers["Webhook-Timestamp"], body, headers["Webhook-Signature"]
    )
    assert not webhooks.verify(
        "whsec_wrong", headers["Webhook-Timestamp"], body, headers["Webhook-Signature"]
    )
    assert not webhooks.verify(
        endpoint["secret"], headers["Webhook-Timestamp"], body + b" ", headers["Webhook-Signature"]
    )
    event = json.loads(body)
    assert event["type"] == "payment.cancelled" and headers["Webhook-Id"] == event["id"]
    assert event["data"]["payment_id"] == payment_id and event["data"]["status"] == "CANCELLED"


def test_500_then_200_is_retried_and_logged(alice, receiver):
    register(alice, receiver.url)
    receiver.answers = [500]
    payment_id = alice.schedule().json()["payment_id"]
    alice.api.delete(f"/api/v1/payments/{payment_id}/cancel")
    (delivery,) = WebhookDelivery.objects.all()
    assert webhooks.deliver(delivery.pk) == "pending"
    delivery.refresh_from_db()
    assert delivery.next_attempt_at > timezone.now() and delivery.last_status_code == 500
    assert webhooks.deliver(delivery.pk) is None  # not due yet: nothing sent
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    assert webhooks.due_delivery_ids() == [str(delivery.pk)]
    assert webhooks.deliver(delivery.pk) == "succeeded"
    assert webhooks.deliver(delivery.pk) is None  # accepted once: never again
    assert [h["Webhook-Id"] for h, _ in receiver.requests] == [str(delivery.pk)] * 2
    attempts = list(WebhookAttempt.objects.filter(delivery=delivery).order_by("number"))
    assert [(a.number, a.status_code) for a in attempts] == [(1, 500), (2, 200)]
    log = alice.api.get(f"/api/v1/webhook-endpoints/{delivery.endpoint_id}/deliveries").json()
    assert log["deliveries"][0]["status"] == "succeeded" and log["deliveries"][0]["attempts"] == 2


def test_gives_up_after_the_cap(alice, settings):
    settings.WEBHOOK_MAX_ATTEMPTS = 2
    register(alice, "http://127.0.0.1:9/unreachable")
    payment_id = alice.schedule().json()["payment_id"]
    alice.api.delete(f"/api/v1/payments/{payment_id}/cancel")
    (delivery,) = WebhookDelivery.objects.all()
    assert webhooks.deliver(delivery.pk) == "pending"
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    assert webhooks.deliver(delivery.pk) == "failed"
    assert "Connection refused" in WebhookAttempt.objects.filter(delivery=delivery).last().error


def test_rolled_back_transaction_sends_nothing(alice, receiver):
    register(alice, receiver.url)
    payment_id = alice.schedule().json()["payment_id"]
    with pytest.raises(RuntimeError), transaction.atomic():
        services.payment_cancel(payment_id=payment_id, client=alice.user)
        assert WebhookDelivery.objects.count() == 1  # written inside the transaction…
        raise RuntimeError("something later in the transaction failed")
    assert WebhookDelivery.objects.count() == 0  # …and gone with it
    assert webhooks.due_delivery_ids() == []
    assert receiver.requests == []


def test_completed_and_failed_payments_emit_events(alice, bob, receiver, monkeypatch):
    from ledger import services as ledger
    from payments import execution

    register(alice, receiver.url)
    ok = alice.schedule(amount=10).json()["payment_id"]
    bad = alice.schedule(amount=10, to_account_id=bob.account.pk).json()["payment_id"]
    ledger.account_set_status(account_id=bob.account.pk, status="frozen")
    make_due(ok, bad)
    _, published = sweep(monkeypatch)
    execution.execute_chunk(published.items())
    types = dict(WebhookDelivery.objects.values_list("payload__data__payment_id", "event_type"))
    assert types == {ok: "payment.completed", bad: "payment.failed"}


def test_delivery_is_enqueued_after_commit(
    alice, receiver, django_capture_on_commit_callbacks, monkeypatch
):
    from payments import tasks

    sent = []
    monkeypatch.setattr(
        tasks.deliver_webhook, "apply_async", lambda args, **kw: sent.append(args[0])
    )
    register(alice, receiver.url)
    payment_id = alice.schedule().json()["payment_id"]
    with django_capture_on_commit_callbacks(execute=True):
        services.payment_cancel(payment_id=payment_id, client=alice.user)
        assert sent == []  # nothing before commit
    assert sent == [str(WebhookDelivery.objects.get().pk)]


def test_occurrence_failed_and_paused_events(alice, receiver, settings):
    from payments import recurring
    from payments.models import RecurringPayment

    settings.RECURRING_MATERIALIZE_AHEAD_SECONDS = 0
    register(alice, receiver.url, events=("recurring.occurrence_failed", "recurring.paused"))
    start = timezone.now() - timedelta(seconds=5)
    RecurringPayment.objects.create(
        from_account=alice.account,
        to_account=alice.other_account,
        amount=999_999,
        interval_seconds=60,
        start_time=start,
        next_run_at=start,
        max_consecutive_failures=1,
    )
    recurring.materialize_due()
    assert sorted(WebhookDelivery.objects.values_list("event_type", flat=True)) == [
        "recurring.occurrence_failed",
        "recurring.paused",
    ]
