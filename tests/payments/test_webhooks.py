"""Signed webhooks delivered to a local HTTP receiver."""

import io
import json
import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone

from payments import services, webhook_transport, webhooks
from payments.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint, WebhookEvent
from tests.payments.conftest import dispatched
from tests.payments.helpers import make_due, sweep
from tests.payments.test_api import error

pytestmark = pytest.mark.django_db

PUBLIC_IP = "93.184.215.14"  # what fake_dns answers for "public" names; never connected to


def register(client, url, events=("payment.completed", "payment.cancelled", "payment.failed")):
    response = client.api.post(
        "/api/v1/webhook-endpoints", {"url": url, "event_types": list(events)}, format="json"
    )
    assert response.status_code == 201, response.content
    return response.json()


def test_endpoint_api_and_isolation(alice, bob, fake_dns):
    fake_dns["example.test"] = [PUBLIC_IP]
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


def test_registration_looks_the_host_up_within_its_own_short_budget(alice, settings, monkeypatch):
    """The lookup runs inside the web request: WEBHOOK_REGISTRATION_DNS_SECONDS, not
    the delivery's WEBHOOK_TIMEOUT_SECONDS, bounds the web thread it holds; a name
    that does not answer in time is refused like any other."""
    from payments import webhook_transport

    settings.WEBHOOK_TIMEOUT_SECONDS = 30
    settings.WEBHOOK_REGISTRATION_DNS_SECONDS = 0.7
    asked = []

    def lookup(host, port, timeout):
        asked.append((host, timeout))
        raise TimeoutError

    monkeypatch.setattr(webhook_transport, "_lookup", lookup)
    refused = alice.api.post(
        "/api/v1/webhook-endpoints",
        {"url": "https://never-answers.example/hooks", "event_types": ["payment.failed"]},
        format="json",
    )
    assert set(error(refused, 400, "validation_error")["details"]["fields"]) == {"url"}
    assert asked == [("never-answers.example", 0.7)]
    assert not WebhookEndpoint.objects.exists()


def test_endpoint_writes_have_a_budget_of_their_own_per_client(alice, bob, fake_dns, monkeypatch):
    """WEBHOOK_ENDPOINT_WRITE_RATE (here 2 a minute): each write may hold a web
    thread for a DNS lookup, so a client past it gets 429 (reads still go
    through) and another client is not affected."""
    from payments.api.auth import WebhookEndpointWriteThrottle

    monkeypatch.setattr(WebhookEndpointWriteThrottle, "rate", "2/min", raising=False)
    fake_dns["example.test"] = [PUBLIC_IP]
    eid = register(alice, "https://example.test/a")["webhook_endpoint_id"]
    patched = alice.api.patch(
        f"/api/v1/webhook-endpoints/{eid}", {"is_active": False}, format="json"
    )
    assert patched.status_code == 200
    third = alice.api.post(
        "/api/v1/webhook-endpoints",
        {"url": "https://example.test/b", "event_types": ["payment.failed"]},
        format="json",
    )
    error(third, 429, "throttled")
    assert int(third["Retry-After"]) >= 1
    again = alice.api.patch(f"/api/v1/webhook-endpoints/{eid}", {"is_active": True}, format="json")
    error(again, 429, "throttled")
    assert alice.api.get("/api/v1/webhook-endpoints").status_code == 200
    assert alice.api.get(f"/api/v1/webhook-endpoints/{eid}").status_code == 200
    register(bob, "https://example.test/bob")
    assert WebhookEndpoint.objects.filter(client=alice.user).count() == 1


@pytest.mark.django_db(transaction=True)  # the look-up runs on a thread of its own
def test_a_clients_endpoint_writes_run_one_at_a_time(alice, bob, fake_dns, monkeypatch):
    """Each write may hold a web thread for its DNS look-up: a client's second write
    while the first is in flight gets 429 (Retry-After) at once — a burst of
    parallel registrations would take the web threads from every other client —
    while another client's write goes through; the slot is free again when the
    request ends, however it ends."""
    from payments.webhook_transport import resolve as resolve_ip

    fake_dns["example.test"] = [PUBLIC_IP]
    seen = {}

    def resolve(host, port):
        if host == "slow.example.test" and not seen:  # alice's first write, in its look-up
            seen["alice"] = alice.api.post(
                "/api/v1/webhook-endpoints",
                {"url": "https://example.test/second", "event_types": ["payment.failed"]},
                format="json",
            )
            seen["bob"] = bob.api.post(
                "/api/v1/webhook-endpoints",
                {"url": "https://example.test/bob", "event_types": ["payment.failed"]},
                format="json",
            )
            host = "example.test"
        return resolve_ip(host, port)

    monkeypatch.setattr(webhook_transport, "resolve", resolve)
    eid = register(alice, "https://slow.example.test/first")["webhook_endpoint_id"]
    body = error(seen["alice"], 429, "throttled")
    assert "in progress" in body["message"] and int(seen["alice"]["Retry-After"]) >= 1
    assert seen["bob"].status_code == 201
    patched = alice.api.patch(
        f"/api/v1/webhook-endpoints/{eid}", {"is_active": False}, format="json"
    )
    assert patched.status_code == 200  # the slot was given back
    monkeypatch.setattr(webhooks, "endpoint_create", lambda **kw: 1 / 0)
    crashed = alice.api.post(
        "/api/v1/webhook-endpoints",
        {"url": "https://example.test/c", "event_types": ["payment.failed"]},
        format="json",
    )
    error(crashed, 500, "internal_error")
    patched = alice.api.patch(
        f"/api/v1/webhook-endpoints/{eid}", {"is_active": True}, format="json"
    )
    assert patched.status_code == 200  # given back after the 500 too
    assert WebhookEndpoint.objects.filter(client=alice.user).count() == 1


def test_the_one_at_a_time_slot_lets_requests_through_when_the_cache_is_down(monkeypatch):
    from django.core.cache import caches
    from redis.exceptions import ConnectionError as RedisDown

    from payments.api.auth import OneAtATime

    slot = OneAtATime("test", seconds=5)
    token = slot.acquire(7)
    assert token and slot.acquire(7) is None and slot.acquire(8)  # per client
    slot.release(7, "someone else's")  # not the holder's token: nothing freed
    assert slot.acquire(7) is None
    slot.release(7, token)
    again = slot.acquire(7)
    assert again
    slot.release(7, again)

    def down(*args, **kwargs):
        raise RedisDown("cache down")

    monkeypatch.setattr(caches["default"], "add", down)
    assert slot.acquire(7) == ""  # allowed, nothing held
    slot.release(7, "")


def test_signed_delivery_the_receiver_can_verify(alice, receiver):
    endpoint = register(alice, receiver.url)
    payment_id = alice.schedule().json()["payment_id"]
    alice.api.delete(f"/api/v1/payments/{payment_id}/cancel")
    dispatched()
    (delivery,) = WebhookDelivery.objects.all()
    assert webhooks.deliver(delivery.pk) == "succeeded"
    (headers, body, _) = receiver.requests[0]
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


@pytest.mark.parametrize(
    ("age", "accepted"),
    [(0, True), (290, True), (-290, True), (310, False), (3600, False), (-310, False)],
)
def test_verify_rejects_stale_or_future_timestamps(age, accepted):
    """A correctly signed delivery replayed outside the 5-minute window (README:
    "reject timestamps older than 5 minutes") is refused; so is one from the future."""
    import time

    secret, body = "whsec_test", b'{"id": "evt", "type": "payment.completed"}'
    timestamp = int(time.time()) - age
    signature = webhooks.sign(secret, timestamp, body)
    assert webhooks.verify(secret, str(timestamp), body, signature) is accepted


def test_500_then_200_is_retried_and_logged(alice, receiver):
    register(alice, receiver.url)
    receiver.answers = [500]
    payment_id = alice.schedule().json()["payment_id"]
    alice.api.delete(f"/api/v1/payments/{payment_id}/cancel")
    dispatched()
    (delivery,) = WebhookDelivery.objects.all()
    assert webhooks.deliver(delivery.pk) == "pending"
    delivery.refresh_from_db()
    assert delivery.next_attempt_at > timezone.now() and delivery.last_status_code == 500
    assert webhooks.deliver(delivery.pk) is None  # not due yet: nothing sent
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    assert webhooks.due_delivery_ids() == [str(delivery.pk)]
    assert webhooks.deliver(delivery.pk) == "succeeded"
    assert webhooks.deliver(delivery.pk) is None  # accepted once: never again
    assert [h["Webhook-Id"] for h, _, _ in receiver.requests] == [str(delivery.pk)] * 2
    attempts = list(WebhookAttempt.objects.filter(delivery=delivery).order_by("number"))
    assert [(a.number, a.status_code) for a in attempts] == [(1, 500), (2, 200)]
    log = alice.api.get(f"/api/v1/webhook-endpoints/{delivery.endpoint_id}/deliveries").json()
    assert log["deliveries"][0]["status"] == "succeeded" and log["deliveries"][0]["attempts"] == 2


def test_gives_up_after_the_cap(alice, settings):
    settings.WEBHOOK_MAX_ATTEMPTS = 2
    register(alice, "http://127.0.0.1:9/unreachable")
    payment_id = alice.schedule().json()["payment_id"]
    alice.api.delete(f"/api/v1/payments/{payment_id}/cancel")
    dispatched()
    (delivery,) = WebhookDelivery.objects.all()
    assert webhooks.deliver(delivery.pk) == "pending"
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    assert webhooks.deliver(delivery.pk) == "failed"
    # Only a generic class, in the attempt log and in the client's delivery log:
    # the network's own message (refused, unreachable, ...) would be a port scanner.
    assert WebhookAttempt.objects.filter(delivery=delivery).last().error == "connection_failed"
    log = alice.api.get(f"/api/v1/webhook-endpoints/{delivery.endpoint_id}/deliveries")
    assert log.json()["deliveries"][0]["last_error"] == "connection_failed"
    assert "refused" not in log.content.decode().lower()


def test_rolled_back_transaction_sends_nothing(alice, receiver):
    register(alice, receiver.url)
    payment_id = alice.schedule().json()["payment_id"]
    with pytest.raises(RuntimeError), transaction.atomic():
        services.payment_cancel(payment_id=payment_id, client=alice.user)
        assert WebhookEvent.objects.count() == 1  # written inside the transaction…
        raise RuntimeError("something later in the transaction failed")
    assert WebhookEvent.objects.count() == 0  # …and gone with it
    dispatched()
    assert WebhookDelivery.objects.count() == 0
    assert webhooks.due_delivery_ids() == []
    assert receiver.requests == []


def test_completed_and_failed_payments_emit_events(alice, bob, receiver, monkeypatch):
    from ledger import services as ledger
    from payments.engine import executor

    register(alice, receiver.url)
    ok = alice.schedule(amount=10).json()["payment_id"]
    bad = alice.schedule(amount=10, to_account_id=bob.account.pk).json()["payment_id"]
    ledger.account_set_status(account_id=bob.account.pk, status="frozen")
    make_due(ok, bad)
    _, published = sweep(monkeypatch)
    executor.execute_chunk(published.items())
    dispatched()
    types = dict(WebhookDelivery.objects.values_list("payload__data__payment_id", "event_type"))
    assert types == {ok: "payment.completed", bad: "payment.failed"}


# event_types an endpoint may hold when written past the API's validation
NOT_LISTS = ({"payment.completed": True}, "payment.completed", 7)


def test_events_go_to_subscribed_active_endpoints_and_bad_subscriptions_match_nothing(
    alice, bob, receiver
):
    """``emit`` records an event for a client with an active endpoint subscribed
    to its type, and nothing else; an ``event_types`` that is not a list (written
    past the API's validation) subscribes to nothing and fails no one's call."""
    register(alice, receiver.url, events=("payment.completed",))
    inactive = register(alice, receiver.url, events=("payment.failed",))
    WebhookEndpoint.objects.filter(pk=inactive["webhook_endpoint_id"]).update(is_active=False)
    broken = register(bob, receiver.url, events=("payment.completed",))
    for bad in NOT_LISTS:
        WebhookEndpoint.objects.filter(pk=broken["webhook_endpoint_id"]).update(event_types=bad)
        with transaction.atomic():
            rows = webhooks.emit(
                [
                    (alice.user.pk, "payment.completed", {"n": 1}),
                    (alice.user.pk, "payment.failed", {"n": 2}),
                    (alice.user.pk, "payment.cancelled", {"n": 3}),
                    (bob.user.pk, "payment.completed", {"n": 4}),
                    (bob.user.pk, "payment.failed", {"n": 5}),
                ]
            )
        assert [(r.client_id, r.event_type, r.data) for r in rows] == [
            (alice.user.pk, "payment.completed", {"n": 1})
        ]
    WebhookEndpoint.objects.filter(pk=broken["webhook_endpoint_id"]).update(
        event_types=["payment.failed", "payment.completed"]
    )
    with transaction.atomic():
        rows = webhooks.emit([(bob.user.pk, "payment.completed", {}), (bob.user.pk, "x", {})])
    assert [(r.client_id, r.event_type) for r in rows] == [(bob.user.pk, "payment.completed")]


def test_fan_out_skips_an_endpoint_whose_subscriptions_are_not_a_list(alice, bob, receiver):
    """Beside a client's good endpoint, one whose ``event_types`` is not a list
    (written past the API's validation) gets no delivery, and the fan-out of
    the other clients' events in the same batch goes on."""
    good = register(bob, receiver.url, events=("payment.completed",))
    broken = register(bob, receiver.url, events=("payment.completed",))
    register(alice, receiver.url, events=("payment.completed",))
    for bad in NOT_LISTS:
        WebhookEndpoint.objects.filter(pk=broken["webhook_endpoint_id"]).update(event_types=bad)
        with transaction.atomic():
            rows = webhooks.emit(
                [
                    (bob.user.pk, "payment.completed", {"bad": str(bad)}),
                    (alice.user.pk, "payment.completed", {"bad": str(bad)}),
                ]
            )
        webhooks.dispatch([row.pk for row in rows])
        made = WebhookDelivery.objects.filter(event__in=rows)
        assert sorted(
            str(e) for e in made.values_list("endpoint__client__username", flat=True)
        ) == sorted([bob.user.username, alice.user.username])
        assert not made.filter(endpoint_id=broken["webhook_endpoint_id"]).exists()
        assert made.filter(endpoint_id=good["webhook_endpoint_id"]).count() == 1


def test_delivery_is_enqueued_after_commit(
    alice, receiver, django_capture_on_commit_callbacks, monkeypatch
):
    from payments import tasks

    sent = []
    monkeypatch.setattr(
        tasks.dispatch_webhooks, "apply_async", lambda args, **kw: sent.append(args[0])
    )
    register(alice, receiver.url)
    payment_id = alice.schedule().json()["payment_id"]
    with django_capture_on_commit_callbacks(execute=True):
        services.payment_cancel(payment_id=payment_id, client=alice.user)
        assert sent == []  # nothing before commit
    assert sent == [[str(WebhookEvent.objects.get().pk)]]


def test_an_executed_chunk_costs_one_outbox_row_per_event_and_one_message(
    alice, receiver, django_capture_on_commit_callbacks, monkeypatch
):
    """However many endpoints a client registered, the payment worker writes one
    event row per payment and publishes one message per chunk; the webhook worker
    expands them into deliveries and sends none to an endpoint whose circuit is open."""
    from payments import tasks
    from payments.engine import executor
    from tests.payments.helpers import make_due, sweep

    dispatched_events, delivered = [], []
    monkeypatch.setattr(
        tasks.dispatch_webhooks, "apply_async", lambda args, **kw: dispatched_events.append(args[0])
    )
    monkeypatch.setattr(
        tasks.deliver_webhook, "apply_async", lambda args, **kw: delivered.append(args[0])
    )
    for _ in range(3):
        register(alice, receiver.url, events=("payment.completed",))
    dead = register(alice, receiver.url, events=("payment.completed",))["webhook_endpoint_id"]
    WebhookEndpoint.objects.filter(pk=dead).update(
        circuit_open_until=timezone.now() + timedelta(minutes=5)
    )
    ids = [alice.schedule().json()["payment_id"] for _ in range(5)]
    make_due(*ids)
    _, published = sweep(monkeypatch)
    with django_capture_on_commit_callbacks(execute=True):
        executor.execute_chunk(published.items())
    assert WebhookEvent.objects.count() == 5 and WebhookDelivery.objects.count() == 0
    assert len(dispatched_events) == 1 and len(dispatched_events[0]) == 5
    assert delivered == []  # the payment worker published nothing per delivery
    # the webhook worker: 5 events x 4 endpoints, 15 sent (not to the open circuit)
    assert tasks.dispatch_webhooks(dispatched_events[0]) == 15
    assert WebhookDelivery.objects.count() == 20 and len(delivered) == 15
    assert tasks.dispatch_webhooks(dispatched_events[0]) == 0  # dispatched once only
    assert WebhookDelivery.objects.count() == 20


def test_a_half_open_endpoint_gets_no_message_per_delivery_only_its_probe(
    alice, receiver, monkeypatch
):
    """An endpoint whose circuit has lapsed (half-open) waits for its one probe
    from the beat scan: dispatching a chunk's events sends none of its deliveries
    (each would be a task only to be deferred), while a closed endpoint's go out."""
    from payments import tasks

    delivered = []
    monkeypatch.setattr(
        tasks.deliver_webhook, "apply_async", lambda args, **kw: delivered.append(args[0])
    )
    live = register(alice, receiver.url, events=("payment.cancelled",))["webhook_endpoint_id"]
    lapsed = register(alice, receiver.url, events=("payment.cancelled",))["webhook_endpoint_id"]
    WebhookEndpoint.objects.filter(pk=lapsed).update(
        circuit_open_until=timezone.now() - timedelta(seconds=1), consecutive_failures=5
    )
    for _ in range(3):
        payment_id = alice.schedule().json()["payment_id"]
        alice.api.delete(f"/api/v1/payments/{payment_id}/cancel")
    assert tasks.dispatch_webhooks(list(WebhookEvent.objects.values_list("pk", flat=True))) == 3
    sent = WebhookDelivery.objects.filter(pk__in=delivered)
    assert {str(d.endpoint_id) for d in sent} == {live} and len(delivered) == 3
    assert WebhookDelivery.objects.filter(endpoint_id=lapsed).count() == 3  # waiting
    probes = webhooks.due_delivery_ids()
    assert [str(d.endpoint_id) for d in WebhookDelivery.objects.filter(pk__in=probes)].count(
        lapsed
    ) == 1


def test_occurrence_failed_and_paused_events(alice, receiver, settings):
    from payments.engine import materializer
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
    materializer.materialize_due()
    dispatched()
    assert sorted(WebhookDelivery.objects.values_list("event_type", flat=True)) == [
        "recurring.occurrence_failed",
        "recurring.paused",
    ]
    # the paused event says why, as a schedule parked after an error does
    paused = WebhookDelivery.objects.get(event_type="recurring.paused").payload["data"]
    schedule = RecurringPayment.objects.get()
    assert paused["status_reason"] == schedule.status_reason != ""
    assert paused["reason"] == "too many consecutive failures"


# --- circuit breaker -----------------------------------------------------------------


def cancelled_deliveries(client, count):
    """``count`` deliveries to the client's endpoint, oldest first."""
    for _ in range(count):
        payment_id = client.schedule().json()["payment_id"]
        client.api.delete(f"/api/v1/payments/{payment_id}/cancel")
        dispatched()
    return list(WebhookDelivery.objects.order_by("created_at", "pk"))


def due_now(*deliveries):
    WebhookDelivery.objects.filter(pk__in=[d.pk for d in deliveries]).update(
        next_attempt_at=timezone.now()
    )


def test_circuit_opens_defers_without_requests_then_a_probe_closes_it(alice, receiver, settings):
    settings.WEBHOOK_CIRCUIT_FAILURES = 2
    settings.WEBHOOK_CIRCUIT_COOLDOWN_SECONDS = 60
    register(alice, receiver.url)
    d1, d2, d3, d4 = cancelled_deliveries(alice, 4)
    receiver.answers = [500, 503]
    assert webhooks.deliver(d1.pk) == "pending"
    assert webhooks.deliver(d2.pk) == "pending"  # 2nd consecutive failure: circuit opens
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.consecutive_failures == 2 and endpoint.circuit_opens == 1
    assert endpoint.circuit_open_until > timezone.now() + timedelta(seconds=50)

    # Open: due deliveries wait for the re-open time; no request, no attempt spent.
    due_now(d1)
    assert webhooks.deliver(d3.pk) is None
    assert webhooks.deliver(d1.pk) is None
    assert len(receiver.requests) == 2
    for delivery, attempts in ((d1, 1), (d3, 0)):
        delivery.refresh_from_db()
        assert (delivery.status, delivery.attempts) == ("pending", attempts)
        assert delivery.last_error == "circuit_open"
        assert delivery.next_attempt_at == endpoint.circuit_open_until
    assert webhooks.due_delivery_ids() == []  # the beat does not republish them either
    log = alice.api.get(f"/api/v1/webhook-endpoints/{endpoint.pk}/deliveries").json()
    assert {d["last_error"] for d in log["deliveries"]} == {"circuit_open", "http_503", ""}

    # Cool-down over: one delivery probes, fails, and the circuit re-opens for twice as long.
    WebhookEndpoint.objects.update(circuit_open_until=timezone.now())
    due_now(d1, d2, d3, d4)
    # the scan offers the lapsed endpoint one delivery, its probe, not its whole backlog
    offered = webhooks.due_delivery_ids()
    assert len(offered) == 1 and offered[0] in {str(d.pk) for d in (d1, d2, d3, d4)}
    receiver.answers = [500]
    before = timezone.now()
    assert webhooks.deliver(d3.pk) == "pending"
    assert webhooks.deliver(d4.pk) is None
    endpoint.refresh_from_db()
    assert endpoint.circuit_opens == 2 and endpoint.consecutive_failures == 3
    assert endpoint.circuit_open_until >= before + timedelta(seconds=120)
    assert len(receiver.requests) == 3

    # Next probe succeeds: the circuit closes and deliveries flow again.
    WebhookEndpoint.objects.update(circuit_open_until=timezone.now())
    due_now(d1, d2, d3, d4)
    assert webhooks.deliver(d4.pk) == "succeeded"
    endpoint.refresh_from_db()
    assert (endpoint.consecutive_failures, endpoint.circuit_open_until, endpoint.circuit_opens) == (
        0,
        None,
        0,
    )
    # closed again: the whole backlog is offered
    assert sorted(webhooks.due_delivery_ids()) == sorted(str(d.pk) for d in (d1, d2, d3))
    assert [webhooks.deliver(d.pk) for d in (d1, d2, d3)] == ["succeeded"] * 3
    assert len(receiver.requests) == 7


@pytest.mark.django_db(transaction=True)
def test_open_circuit_holds_under_concurrent_claims(alice, receiver, settings):
    """Threads claiming many due deliveries of one endpoint: while open, none sends;
    after the cool-down exactly one probes while the others wait for it."""
    from tests.concurrency import run_in_threads

    settings.WEBHOOK_TIMEOUT_SECONDS = 10
    settings.WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT = 8  # the circuit decides here, not the share
    register(alice, receiver.url)
    deliveries = cancelled_deliveries(alice, 8)
    WebhookEndpoint.objects.update(
        consecutive_failures=5,
        circuit_opens=1,
        circuit_open_until=timezone.now() + timedelta(minutes=5),
    )
    results = {}

    def deliver(i):
        results[i] = webhooks.deliver(deliveries[i].pk)

    assert run_in_threads(deliver, len(deliveries)) == []
    assert set(results.values()) == {None} and receiver.requests == []
    assert set(WebhookDelivery.objects.values_list("attempts", flat=True)) == {0}

    WebhookEndpoint.objects.update(circuit_open_until=timezone.now())
    due_now(*deliveries)
    results.clear()
    receiver.hold = threading.Event()  # the probe's request stays in flight...
    others_done = threading.Semaphore(0)

    def deliver_and_signal(i):
        results[i] = webhooks.deliver(deliveries[i].pk)
        others_done.release()

    def release_probe_when_others_are_done():
        for _ in range(len(deliveries) - 1):  # ...until every other claim has decided
            assert others_done.acquire(timeout=60)
        receiver.hold.set()

    releaser = threading.Thread(target=release_probe_when_others_are_done)
    releaser.start()
    assert run_in_threads(deliver_and_signal, len(deliveries)) == []
    releaser.join(5)
    outcomes = list(results.values())
    assert outcomes.count("succeeded") == 1 and outcomes.count(None) == len(deliveries) - 1
    assert len(receiver.requests) == 1
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.circuit_open_until is None and endpoint.consecutive_failures == 0


# --- a fair share per client ---------------------------------------------------------


def test_a_client_share_lines_up_what_exceeds_it_first_come_first_served(settings, monkeypatch):
    """Up to the share start at once; the rest wait in the client's line, each handed
    a slot (promised) when one frees, in arrival order; a delivery back at its turn
    goes first; a promise not taken up lapses; other clients are not affected."""
    settings.WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT = 2
    clock = [100.0]
    monkeypatch.setattr(webhooks, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    shares = webhooks._ClientShares()

    def take(delivery, **kw):
        return shares.take("alice", delivery, returning=kw.get("returning", False), until=delivery)

    assert [take("d1"), take("d2")] == [True, True]
    assert shares.take("bob", "b1", returning=False, until=None) is True  # per client
    assert [take("d3"), take("d4"), take("d5")] == [False, False, False]
    for delivery in ("d3", "d4"):
        shares.put_off("alice", delivery)
    assert shares.next_in_line("alice") is None  # no slot free
    shares.done("alice")
    assert shares.next_in_line("alice") == ("d3", "d3")  # its slot promised to d3
    assert shares.next_in_line("alice") is None
    assert take("d6") is False  # a newcomer neither takes the promised slot nor jumps the line
    assert take("d3", returning=True) is True  # d3 arrives: its promised slot
    shares.done("alice")
    assert shares.next_in_line("alice") == ("d4", "d4")  # d5's put-off is not written yet
    shares.put_off("alice", "d5")
    shares.done("alice")
    assert shares.next_in_line("alice") == ("d5", "d5")
    assert shares.next_in_line("alice") is None  # two slots promised: none left
    clock[0] += shares.PROMISE_SECONDS  # d4 and d5 went to another process: promises lapse
    shares.put_off("alice", "d6")
    assert shares.next_in_line("alice") == ("d6", "d6")
    assert take("d7", returning=True) is True  # back at its turn, a slot free: starts
    shares.forget("alice", "d6")
    shares.done("alice")
    shares.done("bob")
    assert shares._in_flight == {} and shares._lines == {} and shares._promised == {}


def test_a_put_off_that_fails_to_be_written_leaves_nothing_in_line(
    alice, receiver, settings, monkeypatch
):
    """A database error while putting a delivery off: it is not left in its client's
    line (where nothing would hand it on and every later delivery would queue behind it)."""
    from django.db import OperationalError

    settings.WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT = 1
    register(alice, receiver.url)
    (delivery,) = cancelled_deliveries(alice, 1)
    shares = webhooks._client_shares
    shares.take(alice.user.pk, "in flight", returning=False, until=None)  # the share is used

    def update_fails(self, **kwargs):
        raise OperationalError("server closed the connection")

    monkeypatch.setattr(type(WebhookDelivery.objects.none()), "update", update_fails)
    with pytest.raises(OperationalError):
        webhooks.deliver(delivery.pk)
    assert shares._lines == {}


def test_a_lapsed_promise_moves_its_clients_line_on_at_the_next_delivery_here(
    alice, bob, receiver, settings, monkeypatch
):
    """A turn handed to alice's first waiting delivery went to another webhook
    process: the promise lapses and her second waiting delivery gets the slot at
    the next delivery in this process — bob's here — or the beat's scan, not after
    the 10-minute fallback (nothing of alice's comes here to hand it on)."""
    from payments import tasks

    settings.WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT = 1
    sent = []
    monkeypatch.setattr(tasks.deliver_webhook, "apply_async", lambda **kw: sent.append(kw))
    shares = webhooks._client_shares
    monkeypatch.setattr(shares, "PROMISE_SECONDS", 0.05)
    register(alice, receiver.url)
    register(bob, receiver.url)
    first, second = cancelled_deliveries(alice, 2)
    (bobs,) = cancelled_deliveries(bob, 1)[2:]
    shares.take(alice.user.pk, "in flight", returning=False, until=None)  # her share is used
    assert [webhooks.deliver(first.pk), webhooks.deliver(second.pk)] == ["client_busy"] * 2
    shares.done(alice.user.pk)  # her request ends: the slot is promised to the first
    webhooks._hand_on(alice.user.pk)
    assert [kw["args"] for kw in sent] == [[str(first.pk)]]  # ... which another process took
    time.sleep(0.06)
    second.refresh_from_db()
    assert second.next_attempt_at > timezone.now() + timedelta(minutes=9)  # still put off
    assert webhooks.deliver(bobs.pk) == "succeeded"
    assert [kw["args"] for kw in sent] == [[str(first.pk)], [str(second.pk)]]
    second.refresh_from_db()
    assert second.next_attempt_at <= timezone.now()
    # the beat's scan does the same when no delivery comes this way
    shares.forget(alice.user.pk, str(second.pk))
    third, fourth = cancelled_deliveries(alice, 2)[-2:]  # made before: a request takes ms
    shares.take(alice.user.pk, "in flight", returning=False, until=None)
    assert [webhooks.deliver(third.pk), webhooks.deliver(fourth.pk)] == ["client_busy"] * 2
    shares.done(alice.user.pk)
    webhooks._hand_on(alice.user.pk)  # promised to the third, which never comes here
    time.sleep(0.06)
    del sent[:]
    tasks.retry_webhooks()
    assert [str(fourth.pk)] in [kw["args"] for kw in sent]
    shares.forget(alice.user.pk, str(fourth.pk))
    assert shares._in_flight == {} and shares._lines == {} and shares._promised == {}


@pytest.mark.django_db(transaction=True)
def test_a_slow_endpoint_takes_its_clients_share_not_the_other_clients_turns(
    alice, bob, settings, monkeypatch
):
    """DESIGN §8: alice's endpoint holds its request (it answers when the test says
    so and never fails, so its circuit never opens); with a share of one request,
    her next delivery waits in her line — put off once, no attempt spent, no message
    polling — while bob's is sent at once; when her request ends, the waiting one
    is made due and sent."""
    from payments import tasks
    from tests.payments.webhook_receivers import Receiver

    settings.WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT = 1
    settings.WEBHOOK_TIMEOUT_SECONDS = 30
    sent = []
    monkeypatch.setattr(tasks.deliver_webhook, "apply_async", lambda **kw: sent.append(kw))
    slow, fast = Receiver(), Receiver()
    try:
        register(alice, slow.url)
        register(bob, fast.url)
        first, second = cancelled_deliveries(alice, 2)
        cancelled_deliveries(bob, 1)
        bobs = WebhookDelivery.objects.get(endpoint__client=bob.user)
        slow.hold = threading.Event()
        outcome = {}

        def send_first():
            try:
                outcome["first"] = webhooks.deliver(first.pk)
            finally:
                connection.close()

        sending = threading.Thread(target=send_first)
        sending.start()
        try:
            for _ in range(300):  # until alice's first request reached her endpoint
                if slow.requests:
                    break
                threading.Event().wait(0.1)
            assert len(slow.requests) == 1
            assert tasks.deliver_webhook(str(second.pk)) == webhooks.CLIENT_BUSY
            second.refresh_from_db()
            assert (second.status, second.attempts, second.last_error) == (
                "pending",
                0,
                "client_busy",
            )
            assert second.next_attempt_at > timezone.now() + timedelta(minutes=9)
            assert sent == []  # waits for its turn, not polling
            assert webhooks.deliver(bobs.pk) == "succeeded"  # while alice's still waits
            assert len(fast.requests) == 1
        finally:
            slow.hold.set()
            sending.join(30)
        assert outcome["first"] == "succeeded"
        assert sent == [{"args": [str(second.pk)], "queue": "webhooks"}]  # its turn came
        second.refresh_from_db()
        assert second.next_attempt_at <= timezone.now()
        assert webhooks.deliver(second.pk) == "succeeded"
        assert len(slow.requests) == 2
    finally:
        slow.close()
        fast.close()


# --- limits, deactivation -------------------------------------------------------------


def test_endpoint_limit_per_client(alice, bob, receiver, settings):
    settings.WEBHOOK_MAX_ENDPOINTS_PER_CLIENT = 2
    register(alice, receiver.url)
    register(alice, receiver.url)
    body = error(
        alice.api.post(
            "/api/v1/webhook-endpoints",
            {"url": receiver.url, "event_types": ["payment.failed"]},
            format="json",
        ),
        422,
        "limit_exceeded",
    )
    assert body["details"]["limit"] == 2
    assert alice.user.webhook_endpoints.count() == 2
    register(bob, receiver.url)  # a quota per client


@pytest.mark.django_db(transaction=True)
def test_endpoint_limit_holds_under_concurrent_creates(alice, settings):
    from payments.exceptions import LimitExceeded
    from tests.concurrency import run_in_threads

    settings.WEBHOOK_MAX_ENDPOINTS_PER_CLIENT = 3

    def create(i):
        webhooks.endpoint_create(
            client=alice.user, url="http://127.0.0.1:9/hooks", event_types=["payment.failed"]
        )

    errors = run_in_threads(create, 8)
    assert len(errors) == 5 and all(isinstance(e, LimitExceeded) for e in errors)
    assert alice.user.webhook_endpoints.count() == 3


def test_fan_out_makes_one_delivery_per_subscribed_active_endpoint_with_its_payload(
    alice, bob, receiver
):
    """The expansion (one statement on PostgreSQL, Python on SQLite) writes exactly
    the subscribed, active endpoints' deliveries, each payload naming its own
    delivery id, the event's type, time (ISO, microseconds, Z) and data; another
    client's endpoints and events are untouched."""
    from payments.clock import iso_timestamp

    both = register(alice, receiver.url, events=("payment.cancelled", "payment.completed"))
    only = register(alice, receiver.url, events=("payment.cancelled",))
    register(alice, receiver.url, events=("payment.completed",))  # not subscribed
    off = register(alice, receiver.url, events=("payment.cancelled",))
    WebhookEndpoint.objects.filter(pk=off["webhook_endpoint_id"]).update(is_active=False)
    register(bob, receiver.url, events=("payment.cancelled",))
    payment_id = alice.schedule().json()["payment_id"]
    alice.api.delete(f"/api/v1/payments/{payment_id}/cancel")
    bob_payment = bob.schedule().json()["payment_id"]
    bob.api.delete(f"/api/v1/payments/{bob_payment}/cancel")
    event = WebhookEvent.objects.get(client=alice.user)
    sent = webhooks.dispatch([event.pk])
    deliveries = {str(d.endpoint_id): d for d in WebhookDelivery.objects.all()}
    assert set(deliveries) == {both["webhook_endpoint_id"], only["webhook_endpoint_id"]}
    assert sorted(o.delivery_id for o in sent) == sorted(str(d.pk) for d in deliveries.values())
    assert not any(o.behind for o in sent)  # within the client's share
    for delivery in deliveries.values():
        assert (delivery.event_id, delivery.event_type, delivery.status) == (
            event.pk,
            "payment.cancelled",
            "pending",
        )
        assert delivery.attempts == 0 and delivery.next_attempt_at is not None
        assert delivery.payload == {
            "id": str(delivery.pk),
            "type": "payment.cancelled",
            "created_at": iso_timestamp(event.created_at),
            "data": event.data,
        }
    event.refresh_from_db()
    assert event.dispatched_at is not None
    assert WebhookEvent.objects.get(client=bob.user).dispatched_at is None
    assert webhooks.dispatch([event.pk]) == []  # expanded once


def test_deactivated_endpoint_gets_no_more_deliveries(alice, receiver):
    eid = register(alice, receiver.url)["webhook_endpoint_id"]
    (queued,) = cancelled_deliveries(alice, 1)
    alice.api.patch(f"/api/v1/webhook-endpoints/{eid}", {"is_active": False}, format="json")
    cancelled_deliveries(alice, 1)
    assert WebhookDelivery.objects.count() == 1  # no new event for it
    assert webhooks.deliver(queued.pk) == "failed"  # the queued one is never sent
    queued.refresh_from_db()
    assert (queued.last_error, queued.attempts) == ("endpoint_disabled", 0)
    assert receiver.requests == [] and webhooks.due_delivery_ids() == []


# --- secrets ------------------------------------------------------------------------------


def raw_rows(table):
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {table}")
        return repr(cursor.fetchall())


def test_secret_is_encrypted_at_rest_and_still_signs(alice, receiver):
    secret = register(alice, receiver.url)["secret"]
    assert secret not in raw_rows("payments_webhookendpoint")
    assert secret.removeprefix("whsec_") not in raw_rows("payments_webhookendpoint")
    (delivery,) = cancelled_deliveries(alice, 1)
    assert webhooks.deliver(delivery.pk) == "succeeded"
    (headers, body, _) = receiver.requests[0]
    assert webhooks.verify(secret, headers["Webhook-Timestamp"], body, headers["Webhook-Signature"])


def test_idempotent_replay_of_a_creation_does_not_contain_the_secret(alice, receiver):
    request = {"url": receiver.url, "event_types": ["payment.failed"]}
    headers = {"Idempotency-Key": "create-hook-1"}
    first = alice.api.post("/api/v1/webhook-endpoints", request, format="json", headers=headers)
    assert first.status_code == 201
    created = first.json()
    assert created["secret"].startswith("whsec_") and created["secret_shown_once"] is False
    replay = alice.api.post("/api/v1/webhook-endpoints", request, format="json", headers=headers)
    assert replay.status_code == 201 and replay.headers["Idempotent-Replayed"] == "true"
    replayed = replay.json()
    assert replayed["secret"] is None and replayed["secret_shown_once"] is True
    assert replayed["webhook_endpoint_id"] == created["webhook_endpoint_id"]
    assert created["secret"] not in raw_rows("payments_idempotencykey")
    assert WebhookEndpoint.objects.count() == 1


def test_admin_never_shows_the_secret(client, alice, receiver):
    from tests.factories import UserFactory

    secret = register(alice, receiver.url)["secret"]
    endpoint = WebhookEndpoint.objects.get()
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    for url in (
        "/admin/payments/webhookendpoint/",
        f"/admin/payments/webhookendpoint/{endpoint.pk}/change/",
    ):
        page = client.get(url).content.decode()
        assert receiver.url in page
        assert secret not in page and endpoint.secret_ciphertext not in page


def test_secret_keys_rotate(alice, receiver, settings):
    from cryptography.fernet import Fernet

    from payments import webhook_secrets

    settings.WEBHOOK_SECRET_KEYS = [Fernet.generate_key().decode()]
    secret = register(alice, receiver.url)["secret"]
    old_key = settings.WEBHOOK_SECRET_KEYS[0]
    settings.WEBHOOK_SECRET_KEYS = [Fernet.generate_key().decode(), old_key]
    call_command("rotate_webhook_secrets", stdout=io.StringIO())
    settings.WEBHOOK_SECRET_KEYS = settings.WEBHOOK_SECRET_KEYS[:1]  # old key gone
    assert webhook_secrets.decrypt(WebhookEndpoint.objects.get().secret_ciphertext) == secret
    (delivery,) = cancelled_deliveries(alice, 1)
    assert webhooks.deliver(delivery.pk) == "succeeded"
    (headers, body, _) = receiver.requests[0]
    assert webhooks.verify(secret, headers["Webhook-Timestamp"], body, headers["Webhook-Signature"])


@pytest.mark.parametrize("move", ["to a dedicated key", "SECRET_KEY rotated"])
def test_moving_off_the_derived_key_keeps_every_secret(alice, receiver, settings, move):
    """With WEBHOOK_SECRET_KEYS empty the key is derived from SECRET_KEY; setting the
    first dedicated key (as the README asks for production), or rotating SECRET_KEY
    with the old one in SECRET_KEY_FALLBACKS, made every stored secret unreadable
    and rotate_webhook_secrets could re-encrypt none (a reviewer's finding). The
    derived keys always decrypt, so the rotation completes the move."""
    from cryptography.fernet import Fernet

    from payments import webhook_secrets

    settings.WEBHOOK_SECRET_KEYS = []
    secret = register(alice, receiver.url)["secret"]
    if move == "to a dedicated key":
        settings.WEBHOOK_SECRET_KEYS = [Fernet.generate_key().decode()]
    else:
        settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
        settings.SECRET_KEY = "a-new-secret-key-" + "x" * 40
    assert webhook_secrets.decrypt(WebhookEndpoint.objects.get().secret_ciphertext) == secret
    call_command("rotate_webhook_secrets", stdout=io.StringIO())
    settings.SECRET_KEY_FALLBACKS = []  # the old SECRET_KEY gone: rewritten under the new key
    ciphertext = WebhookEndpoint.objects.get().secret_ciphertext
    assert webhook_secrets.decrypt(ciphertext) == secret
    if move == "to a dedicated key":  # encrypted with the dedicated key, not the derived one
        assert Fernet(settings.WEBHOOK_SECRET_KEYS[0]).decrypt(ciphertext.encode()).decode() == (
            secret
        )


def test_one_unreadable_secret_does_not_stop_the_rotation_of_the_others(
    alice, bob, receiver, settings
):
    """DESIGN §8: one client's broken row is reported, never a stop for the others."""
    from cryptography.fernet import Fernet
    from django.core.management.base import CommandError

    from payments import webhook_secrets

    old_key = Fernet.generate_key().decode()
    settings.WEBHOOK_SECRET_KEYS = [old_key]
    register(alice, receiver.url)
    secret = register(bob, receiver.url)["secret"]
    broken = WebhookEndpoint.objects.get(client=alice.user)
    broken_cipher = Fernet(Fernet.generate_key()).encrypt(b"lost key").decode()
    WebhookEndpoint.objects.filter(pk=broken.pk).update(secret_ciphertext=broken_cipher)
    settings.WEBHOOK_SECRET_KEYS = [Fernet.generate_key().decode(), old_key]
    out = io.StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("rotate_webhook_secrets", stdout=out)
    assert out.getvalue() == "Re-encrypted 1 webhook secret(s).\n"
    assert f": {broken.pk}." in str(failed.value) and str(failed.value).startswith("1 webhook")
    settings.WEBHOOK_SECRET_KEYS = settings.WEBHOOK_SECRET_KEYS[:1]  # old key gone
    assert (
        webhook_secrets.decrypt(WebhookEndpoint.objects.get(client=bob.user).secret_ciphertext)
        == secret
    )
    assert WebhookEndpoint.objects.get(pk=broken.pk).secret_ciphertext == broken_cipher


def test_an_event_whose_dispatch_message_was_lost_is_dispatched_by_the_beat_scan(
    alice, receiver, monkeypatch
):
    from payments import tasks

    sent = []
    monkeypatch.setattr(
        tasks.dispatch_webhooks, "apply_async", lambda args, **kw: sent.append(args[0])
    )
    register(alice, receiver.url)
    payment_id = alice.schedule().json()["payment_id"]
    alice.api.delete(f"/api/v1/payments/{payment_id}/cancel")  # its message never sent
    event = WebhookEvent.objects.get()
    tasks.retry_webhooks()
    assert sent == []  # too fresh: its own message may still be on its way
    WebhookEvent.objects.update(created_at=timezone.now() - timedelta(seconds=10))
    tasks.retry_webhooks()
    assert sent == [[str(event.pk)]]
