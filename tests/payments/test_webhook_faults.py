"""Webhook delivery where it meets the unexpected: a URL outside ASCII, a delete
racing an attempt, an attempt that never records its outcome, a backlog beside a
recovered endpoint, a fixed URL behind an open circuit, tokens in a URL's query.

Each was found by a review (session 42) and failed before its fix.
"""

import logging
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from uuid import UUID

import pytest
from django.db import connection
from django.utils import timezone

from payments import metrics, webhook_secrets, webhook_transport, webhooks
from payments.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint, WebhookEvent
from tests.concurrency import in_other_connection
from tests.factories import UserFactory
from tests.payments.engine.timer import in_another_transaction
from tests.payments.test_webhooks import cancelled_deliveries, due_now, register
from tests.processes import ROOT

pytestmark = pytest.mark.django_db


def gave_up() -> float:
    return metrics.webhook_deliveries.labels(outcome="gave_up")._value.get()


def test_a_url_outside_ascii_is_delivered_percent_encoded(alice, receiver):
    """http.client sends an ASCII request line: ``/café`` used to fail every
    attempt as connection_failed while the receiver was up."""
    register(alice, receiver.url + "/caf\u00e9/a%20b?x=\u00fc&y=1")
    (delivery,) = cancelled_deliveries(alice, 1)
    assert webhooks.deliver(delivery.pk) == "succeeded"
    ((_, _, path),) = receiver.requests
    assert path.endswith("/caf%C3%A9/a%20b?x=%C3%BC&y=1")  # what was encoded stays so


def test_a_failed_request_logs_the_origin_not_the_path_or_query(alice, caplog, settings):
    """Receivers put tokens in their URLs (``?token=…``): not in our logs."""
    register(alice, "http://127.0.0.1:9/hooks/s3cr3t-path?token=s3cr3t")
    (delivery,) = cancelled_deliveries(alice, 1)
    with caplog.at_level(logging.INFO, logger="payments.webhook_transport"):
        assert webhooks.deliver(delivery.pk) == "pending"
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "http://127.0.0.1:9 failed (connection_failed)" in logged
    assert "s3cr3t" not in logged


def test_an_attempt_that_raises_is_recorded_and_the_cap_still_holds(alice, receiver, settings):
    """Our side raising between the claim and the request (here the secret's
    decryption, as a malformed key did) is an attempt like any other: recorded,
    not counted against the endpoint's circuit, and the delivery fails at the
    cap — it used to be offered again for ever, no attempt row written."""
    settings.WEBHOOK_MAX_ATTEMPTS = 2
    register(alice, receiver.url)
    (delivery,) = cancelled_deliveries(alice, 1)

    def broken(ciphertext):
        raise ValueError("Fernet key must be 32 url-safe base64-encoded bytes.")

    real = webhook_secrets.decrypt
    webhook_secrets.decrypt = broken
    try:
        before = gave_up()
        assert webhooks.deliver(delivery.pk) == "pending"
        due_now(delivery)
        assert webhooks.deliver(delivery.pk) == "failed"
    finally:
        webhook_secrets.decrypt = real
    assert gave_up() == before + 1
    errors = WebhookAttempt.objects.filter(delivery=delivery).values_list("error", flat=True)
    assert list(errors) == ["attempt_error"] * 2
    assert receiver.requests == []
    endpoint = WebhookEndpoint.objects.get()
    assert (endpoint.consecutive_failures, endpoint.circuit_open_until) == (0, None)


def test_a_claim_whose_outcome_was_never_recorded_counts_against_the_cap(alice, receiver, settings):
    """A worker killed after its claim (attempt counted, lease set) records
    nothing: once every attempt is spent the next claim gives up, without a
    request, instead of trying an attempt beyond the cap."""
    settings.WEBHOOK_MAX_ATTEMPTS = 2
    register(alice, receiver.url)
    (delivery,) = cancelled_deliveries(alice, 1)
    for _ in range(2):
        assert isinstance(webhooks._claim(delivery.pk), webhooks._Claim)  # ... and killed
        due_now(delivery)  # the lease runs out
    before = gave_up()
    assert webhooks.deliver(delivery.pk) == "failed"
    assert gave_up() == before + 1
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.last_error) == (2, "attempt_error")
    assert receiver.requests == []


def test_a_malformed_secret_key_is_refused_at_start_naming_its_place_not_its_value():
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "scheduler_project.settings.base",
        "SECRET_KEY": "test-only",
        "WEBHOOK_SECRET_KEYS": f"{'A' * 43}=,not-a-key-0123456789",
    }
    run = subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; settings.INSTALLED_APPS"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0
    assert "WEBHOOK_SECRET_KEYS: key 2 is not a Fernet key" in run.stderr
    assert "not-a-key" not in run.stderr


def test_a_recovered_endpoint_gets_its_probe_beside_another_clients_backlog(alice, bob, receiver):
    """Probes come first in the beat's offer (up to half of it): a backlog of due
    deliveries at closed endpoints took the whole offer, and no recovered
    endpoint of another client got its probe while it lasted."""
    register(alice, receiver.url)
    register(bob, receiver.url)
    alices = cancelled_deliveries(alice, 4)
    bobs = [d for d in cancelled_deliveries(bob, 1) if d.pk not in {a.pk for a in alices}]
    WebhookEndpoint.objects.filter(client=bob.user).update(circuit_open_until=timezone.now())
    due_now(*alices, *bobs)
    offered = webhooks.due_delivery_ids(limit=4)
    assert str(bobs[0].pk) in offered and len(offered) == 4


def test_one_clients_backlog_does_not_push_anothers_due_delivery_out_of_the_scan(alice, bob):
    """DESIGN §8: the beat's scan offered due deliveries oldest first over every
    endpoint, so one client's backlog (an endpoint back after an outage) filled
    each offer and another client's due delivery waited for all of it — 500 every
    10 s (a reviewer's probe). Now the offer goes in turns across endpoints: every
    endpoint's oldest first, then every one's second…, oldest first within a turn."""
    endpoints = {}
    for client in (alice, bob):
        endpoints[client] = WebhookEndpoint.objects.create(
            client=client.user,
            url="https://hooks.example.com/",
            secret_ciphertext=webhook_secrets.encrypt("whsec_test"),
            event_types=["payment.completed"],
        )
    now = timezone.now()

    def due(client, count, seconds_ago):
        made = []
        for k in range(count):
            event = WebhookEvent.objects.create(
                client=client.user, event_type="payment.completed", data={}, created_at=now
            )
            made.append(
                WebhookDelivery.objects.create(
                    endpoint=endpoints[client],
                    event=event,
                    event_type="payment.completed",
                    payload={},
                    next_attempt_at=now - timedelta(seconds=seconds_ago - k),
                )
            )
        return made

    backlog = due(alice, 6, seconds_ago=600)  # due for ten minutes
    late = due(bob, 2, seconds_ago=60)  # due for a minute
    offered = webhooks.due_delivery_ids(limit=4)
    assert offered == [str(d.pk) for d in (backlog[0], late[0], backlog[1], late[1])]
    # turns go oldest first, whoever's they are; the limit cuts the last turn
    assert webhooks.due_delivery_ids(limit=3) == offered[:3]
    # an equal share each first (2 of 5 here); the one with more fills the rest
    assert webhooks.due_delivery_ids(limit=5) == [
        *offered,
        str(backlog[2].pk),
    ]
    WebhookDelivery.objects.filter(pk__in=[late[1].pk]).update(status="succeeded")
    assert webhooks.due_delivery_ids(limit=4) == [
        str(d.pk) for d in (backlog[0], late[0], backlog[1], backlog[2])
    ]
    WebhookDelivery.objects.filter(pk__in=offered).update(status="succeeded")
    assert webhooks.due_delivery_ids(limit=4) == [str(d.pk) for d in backlog[2:]]


def events_of(client, count, endpoint_count=1, url="https://hooks.example.com/"):
    """``count`` undispatched ``payment.completed`` events of ``client``, oldest
    first, with ``endpoint_count`` endpoints at ``url`` subscribed to them."""
    for _ in range(endpoint_count):
        WebhookEndpoint.objects.create(
            client=client.user,
            url=url,
            secret_ciphertext=webhook_secrets.encrypt("whsec_test"),
            event_types=["payment.completed"],
        )
    return WebhookEvent.objects.bulk_create(
        WebhookEvent(
            client=client.user,
            event_type="payment.completed",
            data={"n": k},
            created_at=timezone.now() + timedelta(microseconds=k),
        )
        for k in range(count)
    )


def test_one_clients_burst_is_sent_behind_anothers_deliveries(alice, bob, settings, monkeypatch):
    """DESIGN §8: the webhook queue is first in, first out, and a dispatch sent a
    message per delivery — one client's burst (a payment batch's 500 events) stood
    ahead of every other client's webhooks, each message taking its turn only to
    be put off over the client's share (a reviewer, session 44). Each client's
    free share goes at the default priority; the rest go behind."""
    from payments import tasks

    settings.WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT = 3
    burst = events_of(alice, 7, endpoint_count=2)  # 14 deliveries
    other = events_of(bob, 2)
    sent = []
    monkeypatch.setattr(
        tasks.deliver_webhook, "apply_async", lambda args, **options: sent.append((args, options))
    )
    assert tasks.dispatch_webhooks.run([e.pk for e in [*burst[:3], *other, *burst[3:]]]) == 16
    client_of = dict(WebhookDelivery.objects.values_list("pk", "endpoint__client_id"))
    assert {options["queue"] for _, options in sent} == {"webhooks"}
    ahead = [client_of[UUID(args[0])] for args, options in sent if "priority" not in options]
    behind = [client_of[UUID(args[0])] for args, options in sent if "priority" in options]
    assert sorted(ahead) == sorted([alice.user.pk] * 3 + [bob.user.pk] * 2)
    assert behind == [alice.user.pk] * 11
    assert {o["priority"] for _, o in sent if "priority" in o} == {webhooks.BEHIND_PRIORITY}
    # oldest event first: the share ahead is the burst's first two events' (2 endpoints)
    event_of = dict(WebhookDelivery.objects.values_list("pk", "event_id"))
    alices_ahead = [
        event_of[UUID(args[0])]
        for args, options in sent
        if "priority" not in options and client_of[UUID(args[0])] == alice.user.pk
    ]
    assert set(alices_ahead) == {burst[0].pk, burst[1].pk}


def sent_by(task, monkeypatch) -> list:
    """(client, behind?) of each ``deliver_webhook`` message ``task`` sends, in order."""
    from payments import tasks

    sent = []
    monkeypatch.setattr(
        tasks.deliver_webhook, "apply_async", lambda args, **options: sent.append((args, options))
    )
    task()
    client_of = dict(WebhookDelivery.objects.values_list("pk", "endpoint__client_id"))
    return [(client_of[UUID(args[0])], "priority" in options) for args, options in sent]


def test_the_beat_scans_backlog_goes_behind_past_its_clients_share(
    alice, bob, settings, monkeypatch
):
    """A burst still in the queue is due, so the beat's scan (every 10 s) offered
    up to 500 copies of it at the default priority, ahead of every other client's
    webhooks again (a reviewer of the priority change). The scan's offer goes by
    the same rule as a dispatch."""
    from payments import tasks

    settings.WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT = 2
    webhooks.dispatch([e.pk for e in [*events_of(alice, 5), *events_of(bob, 1)]])
    sent = sent_by(tasks.retry_webhooks.run, monkeypatch)
    assert sorted(sent) == sorted(
        [(alice.user.pk, False)] * 2 + [(alice.user.pk, True)] * 3 + [(bob.user.pk, False)]
    )


def test_a_client_with_its_share_taken_here_gets_nothing_ahead(alice, bob, settings, monkeypatch):
    """The share is the client's free requests in this process, not a fixed number
    a dispatch: a burst spread over many transactions (one dispatch each) sent
    four of every dispatch ahead of everyone else's."""
    from payments import tasks

    settings.WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT = 2
    shares = webhooks._client_shares
    events = [e.pk for e in [*events_of(alice, 3), *events_of(bob, 1)]]
    me = alice.user.pk
    assert shares.take(me, "first", returning=False, until=None)
    try:
        assert shares.free(me) == 1
        sent = sent_by(lambda: tasks.dispatch_webhooks.run(events), monkeypatch)
        assert sorted(sent) == sorted([(me, False)] + [(me, True)] * 2 + [(bob.user.pk, False)])
        assert shares.take(me, "second", returning=False, until=None)  # the share taken
        assert not shares.take(me, "waits", returning=False, until=None)  # in line
        shares.done(me)
        assert shares.free(me) == 0  # a slot is free, but one waits in line for it
    finally:
        for held in (shares._in_flight, shares._lines, shares._promised):
            held.pop(me, None)
    assert shares.free(alice.user.pk) == 2


def test_the_webhook_worker_takes_the_default_priority_before_a_burst_behind(private_redis):
    """What the order above relies on, on a real Redis through kombu's transport
    as the worker reads it (BRPOP over the priority lists): a message at the
    default priority published after 50 at ``BEHIND_PRIORITY`` is taken first."""
    from kombu import Connection, Consumer, Exchange, Producer, Queue

    queue = Queue("webhooks", Exchange("webhooks"), "webhooks")
    taken = []
    with Connection(private_redis.url) as conn:
        channel = conn.channel()
        producer = Producer(channel, exchange=queue.exchange, routing_key="webhooks")
        queue(channel).declare()
        for k in range(50):
            producer.publish({"n": k}, priority=webhooks.BEHIND_PRIORITY)
        producer.publish({"n": "other client"})
        consumer = Consumer(
            channel, [queue], callbacks=[lambda body, m: (taken.append(body["n"]), m.ack())]
        )
        consumer.qos(prefetch_count=1)
        with consumer:
            while len(taken) < 3:
                conn.drain_events(timeout=5)
    assert taken == ["other client", 0, 1]


def test_a_new_url_starts_with_its_circuit_closed_and_the_put_off_deliveries_due(
    alice, receiver, settings
):
    """A client fixing a typo'd URL whose failures opened the circuit: the fixed
    URL is called at once, not after the old one's cool-down (up to an hour)."""
    settings.WEBHOOK_CIRCUIT_FAILURES = 1
    eid = register(alice, "http://127.0.0.1:9/typo")["webhook_endpoint_id"]
    first, second = cancelled_deliveries(alice, 2)
    assert webhooks.deliver(first.pk) == "pending"  # refused: the circuit opens
    due_now(first, second)
    assert webhooks.deliver(second.pk) is None  # put off to the circuit's end
    second.refresh_from_db()
    assert second.next_attempt_at > timezone.now() + timedelta(seconds=30)
    fixed = alice.api.patch(
        f"/api/v1/webhook-endpoints/{eid}", {"url": receiver.url}, format="json"
    )
    assert fixed.status_code == 200, fixed.content
    endpoint = WebhookEndpoint.objects.get()
    assert (endpoint.consecutive_failures, endpoint.circuit_opens) == (0, 0)
    assert endpoint.circuit_open_until is None
    assert webhooks.deliver(second.pk) == "succeeded"
    # the same URL again resets nothing: only a change does
    WebhookEndpoint.objects.update(consecutive_failures=3)
    alice.api.patch(f"/api/v1/webhook-endpoints/{eid}", {"url": receiver.url}, format="json")
    assert WebhookEndpoint.objects.get().consecutive_failures == 3


@pytest.mark.django_db(transaction=True)
def test_deleting_an_endpoint_while_an_attempt_is_being_recorded_waits_for_it(
    alice, receiver, monkeypatch
):
    """The delete's cascade missed the attempt row a worker was committing and
    failed at commit (a 500); now it waits for the worker's hold on the endpoint
    row and deletes the attempt with the rest."""
    eid = register(alice, receiver.url)["webhook_endpoint_id"]
    (delivery,) = cancelled_deliveries(alice, 1)
    entered, go = threading.Event(), threading.Event()
    real = webhooks._record_circuit

    def held(*args, **kwargs):  # inside the outcome's transaction
        entered.set()
        go.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(webhooks, "_record_circuit", held)
    out = {}

    def work():
        try:
            out["deliver"] = webhooks.deliver(delivery.pk)
        finally:
            from django.db import connection

            connection.close()

    def delete():
        try:
            out["delete"] = alice.api.delete(f"/api/v1/webhook-endpoints/{eid}").status_code
        finally:
            from django.db import connection

            connection.close()

    worker = threading.Thread(target=work)
    worker.start()
    assert entered.wait(10)
    deleter = threading.Thread(target=delete)
    deleter.start()
    time.sleep(0.5)
    go.set()
    worker.join(20)
    deleter.join(20)
    assert out == {"deliver": "succeeded", "delete": 204}
    assert not WebhookEndpoint.objects.exists()
    assert not WebhookDelivery.objects.exists() and not WebhookAttempt.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_an_endpoint_deleted_during_the_request_leaves_nothing_to_record(alice, receiver):
    """The client deletes the endpoint while its request is in flight: the
    outcome is dropped with it (it used to fail on the deleted delivery)."""
    eid = register(alice, receiver.url)["webhook_endpoint_id"]
    (delivery,) = cancelled_deliveries(alice, 1)
    real = webhook_transport.post

    def post(*args, **kwargs):
        outcome = real(*args, **kwargs)
        assert alice.api.delete(f"/api/v1/webhook-endpoints/{eid}").status_code == 204
        return outcome

    webhook_transport.post = post
    try:
        assert webhooks.deliver(delivery.pk) is None
    finally:
        webhook_transport.post = real
    assert len(receiver.requests) == 1
    assert not WebhookDelivery.objects.exists() and not WebhookAttempt.objects.exists()


def _deliveries(endpoint, count: int, start) -> None:
    WebhookDelivery.objects.bulk_create(
        WebhookDelivery(
            endpoint=endpoint,
            event_type="payment.completed",
            payload={},
            status="succeeded",
            created_at=start + timedelta(milliseconds=n // 3),  # ties: three an instant
        )
        for n in range(count)
    )


def test_the_delivery_log_is_read_a_page_at_a_time_newest_first(alice, bob, receiver):
    """The log showed the newest 100 and no more; now 100 a page (``limit``,
    ``cursor``, ``next_cursor``), and walking the pages gives every delivery
    once, newest first — ties on ``created_at`` included."""
    eid = register(alice, receiver.url)["webhook_endpoint_id"]
    register(bob, receiver.url)
    start = timezone.now() - timedelta(hours=1)
    _deliveries(WebhookEndpoint.objects.get(pk=eid), 250, start)
    _deliveries(WebhookEndpoint.objects.get(client=bob.user), 50, start)
    url = f"/api/v1/webhook-endpoints/{eid}/deliveries"
    first = alice.api.get(url).json()
    assert len(first["deliveries"]) == 100 and first["next_cursor"]
    seen, cursor = [], None
    while True:
        page = alice.api.get(url, {"limit": 70, **({"cursor": cursor} if cursor else {})})
        seen += page.json()["deliveries"]
        if (cursor := page.json()["next_cursor"]) is None:
            break
    mine = WebhookDelivery.objects.filter(endpoint_id=eid).order_by("-created_at", "-id")
    assert [d["delivery_id"] for d in seen] == [str(pk) for pk in mine.values_list("pk", flat=True)]
    assert alice.api.get(url, {"cursor": "!!"}).status_code == 400


@pytest.mark.postgres
def test_the_delivery_log_reads_one_page_of_its_own_index(alice, bob, receiver):
    """It sorted every delivery of the endpoint for the newest 100 (a seq scan
    and a sort at 20,000: a review, session 42); the index (endpoint,
    created_at DESC, id DESC) yields the page in order, on page 1 as deep down."""
    from payments.selectors import newest_first_page
    from tests.plans import explain_call, index_scan, node_types

    eid = register(alice, receiver.url)["webhook_endpoint_id"]
    register(bob, receiver.url)
    start = timezone.now() - timedelta(hours=1)
    endpoint = WebhookEndpoint.objects.get(pk=eid)
    _deliveries(endpoint, 6_000, start)
    _deliveries(WebhookEndpoint.objects.get(client=bob.user), 6_000, start)
    _, cursor = newest_first_page(endpoint.deliveries.all(), cursor=None, limit=3_000)
    for after in (None, cursor):
        plan = explain_call(
            lambda after=after: newest_first_page(
                endpoint.deliveries.all(), cursor=after, limit=100
            ),
            "payments_webhookdelivery",
        )
        assert "Sort" not in node_types(plan), plan
        scan = index_scan(plan, "webhook_delivery_log")
        assert scan is not None and scan["Actual Rows"] == 101, plan
        assert scan.get("Rows Removed by Filter", 0) == 0, scan


def test_finished_deliveries_are_purged_after_the_retention_with_what_only_they_used(
    alice, receiver, settings
):
    """Deliveries and their attempts grew for ever (8.6M rows a day for an
    endpoint at 100 events/s). Finished ones older than WEBHOOK_RETENTION_DAYS
    go, a batch a transaction, with the events left without a delivery; a
    pending one, however old, and recent ones stay."""
    from payments import tasks
    from payments.models import WebhookEvent

    settings.WEBHOOK_RETENTION_DAYS = 30
    register(alice, receiver.url)
    old_ok, old_failed, old_pending, recent = cancelled_deliveries(alice, 4)
    for delivery in (old_ok, recent):
        assert webhooks.deliver(delivery.pk) == "succeeded"
    WebhookDelivery.objects.filter(pk=old_failed.pk).update(status="failed")
    long_ago = timezone.now() - timedelta(days=31)
    WebhookDelivery.objects.filter(pk__in=[old_ok.pk, old_failed.pk, old_pending.pk]).update(
        created_at=long_ago
    )
    WebhookEvent.objects.exclude(pk=recent.event_id).update(dispatched_at=long_ago)
    settings.WEBHOOK_RETENTION_DAYS = 0  # keeps everything
    assert tasks.purge_webhooks() == 0
    settings.WEBHOOK_RETENTION_DAYS = 30
    assert webhooks.purge_finished(batch=1) == 2
    left = set(WebhookDelivery.objects.values_list("pk", flat=True))
    assert left == {old_pending.pk, recent.pk}
    assert set(WebhookAttempt.objects.values_list("delivery_id", flat=True)) == {recent.pk}
    events = set(WebhookEvent.objects.values_list("pk", flat=True))
    assert events == {old_pending.event_id, recent.event_id}
    assert webhooks.purge_finished() == 0


def test_the_purge_stops_at_its_budget_and_the_next_run_goes_on(alice, receiver, settings):
    settings.WEBHOOK_RETENTION_DAYS = 1
    register(alice, receiver.url)
    deliveries = cancelled_deliveries(alice, 3)
    WebhookDelivery.objects.update(
        status="succeeded", created_at=timezone.now() - timedelta(days=2)
    )
    assert webhooks.purge_finished(batch=1, budget_seconds=0) == 0
    assert WebhookDelivery.objects.count() == len(deliveries)
    assert webhooks.purge_finished(batch=2) == 3
    assert not WebhookDelivery.objects.exists()


def test_the_events_of_a_deleted_endpoint_are_purged_with_age(alice, receiver, settings):
    """Deleting an endpoint takes its deliveries, not their events (another
    endpoint may share them): the purge finds events by their own age once no
    delivery refers to them (a review of this session's purge)."""
    from payments.models import WebhookEvent

    settings.WEBHOOK_RETENTION_DAYS = 30
    eid = register(alice, receiver.url)["webhook_endpoint_id"]
    other = register(alice, receiver.url)["webhook_endpoint_id"]
    cancelled_deliveries(alice, 2)
    assert alice.api.delete(f"/api/v1/webhook-endpoints/{eid}").status_code == 204
    WebhookEvent.objects.update(dispatched_at=timezone.now() - timedelta(days=31))
    assert webhooks.purge_finished() == 0  # the other endpoint's pending deliveries keep them
    assert WebhookEvent.objects.count() == 2
    assert alice.api.delete(f"/api/v1/webhook-endpoints/{other}").status_code == 204
    webhooks.purge_finished()
    assert not WebhookEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_an_outcome_applies_only_to_the_claim_it_was_made_for(alice, receiver, settings):
    """A URL fix while a probe to the old URL is in flight: the reset does not
    make the in-flight delivery due again, and if another claim takes it anyway
    (its lease lapsed) the first request's late outcome is logged, not applied —
    it turned the second claim's success back into pending, sent it a third
    time and re-opened the new URL's circuit with the old URL's failure (a
    review of this session's circuit reset)."""
    settings.WEBHOOK_CIRCUIT_FAILURES = 1
    eid = register(alice, "http://127.0.0.1:9/typo")["webhook_endpoint_id"]
    first, second = cancelled_deliveries(alice, 2)
    assert webhooks.deliver(first.pk) == "pending"  # refused: the circuit opens
    due_now(second)
    assert webhooks.deliver(second.pk) is None  # put off to the circuit's end
    WebhookEndpoint.objects.update(circuit_open_until=timezone.now())
    due_now(second)
    entered, go, out = threading.Event(), threading.Event(), {}
    real = webhook_transport.post

    def post(url, *args, **kwargs):
        if url.endswith("/typo"):
            entered.set()
            go.wait(10)
        return real(url, *args, **kwargs)

    def probe():
        try:
            out["probe"] = webhooks.deliver(second.pk)
        finally:
            from django.db import connection

            connection.close()

    webhook_transport.post = post
    try:
        worker = threading.Thread(target=probe)
        worker.start()
        assert entered.wait(10)  # the probe to the old URL is in flight
        fixed = alice.api.patch(
            f"/api/v1/webhook-endpoints/{eid}", {"url": receiver.url}, format="json"
        )
        assert fixed.status_code == 200
        second.refresh_from_db()
        assert second.next_attempt_at > timezone.now()  # leased: not made due again
        due_now(second)  # its lease lapses anyway
        assert webhooks.deliver(second.pk) == "succeeded"  # a second claim, to the new URL
        go.set()
        worker.join(20)
    finally:
        webhook_transport.post = real
    assert out == {"probe": None}
    second.refresh_from_db()
    assert (second.status, second.attempts) == ("succeeded", 2)
    numbers = WebhookAttempt.objects.filter(delivery=second).values_list("number", "error")
    assert sorted(numbers) == [(1, "connection_failed"), (2, "")]
    endpoint = WebhookEndpoint.objects.get()
    assert (endpoint.circuit_open_until, endpoint.consecutive_failures) == (None, 0)
    assert len(receiver.requests) == 1


def _client_with_endpoint_and_event():
    client = UserFactory()
    endpoint = WebhookEndpoint.objects.create(
        client=client,
        url="https://hooks.example.com/",
        secret_ciphertext=webhook_secrets.encrypt("whsec_test"),
        event_types=["payment.completed"],
    )
    event = WebhookEvent.objects.create(
        client=client, event_type="payment.completed", data={}, created_at=timezone.now()
    )
    return client, endpoint, event


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_client_updating_its_endpoint_holds_up_no_fan_out():
    """DESIGN §8: an endpoint update locked the row FOR UPDATE, which conflicts with
    the key-share lock a delivery's insert takes on its endpoint: every fan-out batch
    holding one of that client's events — other clients' events with it — waited
    for the update (a reviewer's probe). The lock is FOR NO KEY UPDATE now: here it
    is held for as long as the test likes, and both events fan out at once."""
    first, first_endpoint, first_event = _client_with_endpoint_and_event()
    _, second_endpoint, second_event = _client_with_endpoint_and_event()
    release = in_another_transaction(
        lambda: webhooks._owned(first, first_endpoint.pk, lock=True), release_after=20
    )
    try:
        webhooks.dispatch([first_event.pk, second_event.pk])
        lock = "SELECT 1 FROM payments_webhookendpoint WHERE id = %s FOR NO KEY UPDATE NOWAIT"
        assert in_other_connection(lock, [first_endpoint.pk]) == "LockNotAvailable"  # still held
    finally:
        release()
    assert set(WebhookDelivery.objects.values_list("endpoint_id", flat=True)) == {
        first_endpoint.pk,
        second_endpoint.pk,
    }


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_deleting_a_long_history_holds_up_no_fan_out_and_leaves_nothing(monkeypatch):
    """The delete of an endpoint with a long history ran its whole cascade under a
    FOR UPDATE lock on the endpoint row (27 s for 200,000 deliveries): fan-outs
    waited, other clients' events with them. Now it is switched off first and its
    history goes DELETE_HISTORY_BATCH deliveries a transaction: here the delete is
    stopped between two of them while both clients' events fan out — the deleted
    one's to nobody, it is off — and then finishes, leaving no row of it."""
    monkeypatch.setattr(webhooks, "DELETE_HISTORY_BATCH", 2)
    first, first_endpoint, first_event = _client_with_endpoint_and_event()
    _, second_endpoint, second_event = _client_with_endpoint_and_event()
    old = [
        WebhookEvent.objects.create(
            client=first, event_type="payment.completed", data={}, created_at=timezone.now()
        )
        for _ in range(5)
    ]
    webhooks.dispatch([event.pk for event in old])
    WebhookAttempt.objects.bulk_create(
        WebhookAttempt(delivery=delivery, number=1, status_code=500, error="", duration_ms=5)
        for delivery in WebhookDelivery.objects.all()
    )
    batches, paused, go = [], threading.Event(), threading.Event()
    real = WebhookAttempt.objects.filter

    def filter_(*args, **kwargs):
        if "delivery_id__in" in kwargs:
            batches.append(len(kwargs["delivery_id__in"]))
            if len(batches) == 2:  # between two batches: the first committed
                paused.set()
                assert go.wait(20)
        return real(*args, **kwargs)

    monkeypatch.setattr(WebhookAttempt.objects, "filter", filter_)
    out = {}

    def delete():
        try:
            webhooks.endpoint_delete(client=first, endpoint_id=first_endpoint.pk)
            out["deleted"] = True
        finally:
            connection.close()

    deleter = threading.Thread(target=delete)
    deleter.start()
    try:
        assert paused.wait(20)
        webhooks.dispatch([first_event.pk, second_event.pk])
        assert deleter.is_alive()  # the fan-out did not wait for the delete
        made = list(WebhookDelivery.objects.filter(event__in=[first_event, second_event]))
        assert [d.endpoint_id for d in made] == [second_endpoint.pk]
    finally:
        go.set()
        deleter.join(20)
    assert out == {"deleted": True} and batches == [2, 2, 1]
    assert not WebhookEndpoint.objects.filter(pk=first_endpoint.pk).exists()
    assert not WebhookDelivery.objects.filter(endpoint_id=first_endpoint.pk).exists()
    assert WebhookAttempt.objects.count() == 0
    assert WebhookDelivery.objects.filter(endpoint=second_endpoint).count() == 1
