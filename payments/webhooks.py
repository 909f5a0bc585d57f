"""Signed webhooks with a transactional outbox.

``emit`` is called inside the transaction that changes a payment or schedule;
it inserts one ``WebhookEvent`` per event for a client with a subscribed
endpoint — one row however many endpoints, so the caller's cost (often the
executor's) does not depend on a client's endpoints. A rolled-back transaction
therefore leaves nothing to send. After commit one message asks the webhook
worker to ``dispatch`` the events: each becomes one ``WebhookDelivery`` per
subscribed active endpoint, and each delivery is sent by its own task. A beat
task dispatches events whose message was lost and re-sends any pending
delivery whose time has come, so a lost broker message only delays a webhook.

Each request carries::

    Webhook-Id: <delivery id>              (stable across retries: dedupe on it)
    Webhook-Timestamp: <unix seconds>
    Webhook-Signature: v1=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>

The request itself (address rules at connect time, no redirects, one time
budget) is ``webhook_transport.post``; the secret is stored encrypted
(``webhook_secrets``). Failed attempts are retried with exponential backoff
(``WEBHOOK_BACKOFF_SECONDS`` · 2^(n-1), capped at one hour) up to
``WEBHOOK_MAX_ATTEMPTS``; every try is logged in ``WebhookAttempt`` with a
generic error class only (``timeout``, ``connection_failed``, ``tls_error``,
``address_not_allowed``, ``redirect_not_followed``, ``invalid_response``,
``http_<status>``, ``secret_unavailable``); a delivery may also end
``endpoint_disabled`` or wait with ``circuit_open``.

Circuit breaker per endpoint: ``WEBHOOK_CIRCUIT_FAILURES`` consecutive failed
attempts open it for ``WEBHOOK_CIRCUIT_COOLDOWN_SECONDS`` (doubling on each
re-open, capped at one hour). While open, due deliveries are deferred to the
re-open time without a request and without spending an attempt; afterwards
one delivery probes (the others wait for it); a success closes the circuit.

Fair share per client: a webhook worker process makes at most
``WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT`` requests at once for one client's
endpoints, whatever their number. An endpoint slow enough to hold its threads
for the whole budget yet never failing (so never tripping its circuit) would
otherwise take every thread of the pool in turn and hold every other client's
webhooks behind its backlog. A delivery over the share waits in the client's
line, no attempt spent (``client_busy``; ``_ClientShares``), and is sent when
one of the client's requests ends (``turn_came``).

Fair order in the queue: the webhook queue is first in, first out, so one
client's burst — a payment batch's 500 events, 500 delivery messages — stood
ahead of every other client's next webhook, each message taking its turn only
to be put off. What ``dispatch`` and the beat's scan send (``offers``) goes
ahead only up to the client's free share of this process's requests — none
while the client already has deliveries waiting in line here — and the rest
``behind``, at ``BEHIND_PRIORITY``, which kombu's Redis transport serves only
when no message of the default priority waits. Turns handed on and retries
keep the default. Brokers without priorities (the embedded file broker, and
RabbitMQ: its queues are declared without ``x-max-priority``) keep plain
arrival order; RabbitMQ with it would serve 9 *first*, so do not add it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from django.dispatch import Signal
from django.utils import timezone

from ledger.db import binary_cursor, bulk_insert_rows

from . import metrics, webhook_secrets, webhook_transport
from .batches import in_batches
from .clock import iso_timestamp
from .exceptions import InvalidRequest, LimitExceeded, NotFound
from .models import (
    DeliveryStatus,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)

logger = logging.getLogger(__name__)

# Delivery-log error classes besides webhook_transport.ERROR_CLASSES and http_<status>.
ENDPOINT_DISABLED = "endpoint_disabled"
CIRCUIT_OPEN = "circuit_open"
SECRET_UNAVAILABLE = "secret_unavailable"  # noqa: S105 - an error class, not a secret
# the attempt raised on our side (a bug, a bad key): no request, or none recorded
ATTEMPT_ERROR = "attempt_error"
# our own faults, not the endpoint's: they count against no circuit
OUR_ERRORS = (SECRET_UNAVAILABLE, ATTEMPT_ERROR)
CLIENT_BUSY = "client_busy"
TURN_FALLBACK_SECONDS = 600  # a put-off delivery is due again after this whatever happens
# kombu's Redis transport: priority 0 (no priority given) is served first, 9 last
BEHIND_PRIORITY = 9

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


def emit(events: Iterable[tuple[int, str, dict | Callable[[], dict]]]) -> list[WebhookEvent]:
    """Record ``(client_id, event_type, data)`` events for clients with a subscribed endpoint.

    ``data`` may be a function that builds it: called only for an event some
    endpoint subscribes to (the executor's payloads, most of which no one
    subscribed to, cost nothing then).

    Call inside the transaction that made the change. One ``WebhookEvent`` row
    per event (one statement for all of them), however many endpoints the
    client registered: this runs in the executor's transaction, and a client
    with ten endpoints made each of its payments write ten delivery rows
    there (a 200-payment chunk took 0.76 s instead of 0.12 s, holding back
    every other client's payments in the pool). After commit one message asks
    the webhook worker to expand the events into deliveries (``dispatch``).
    """
    events = list(events)
    if not events:
        return []
    subscribed = _subscriptions({client_id for client_id, _, _ in events})
    now = timezone.now()
    rows = [
        WebhookEvent(
            client_id=client_id,
            event_type=event_type,
            data=data() if callable(data) else data,
            created_at=now,
        )
        for client_id, event_type, data in events
        if (client_id, event_type) in subscribed
    ]
    if rows:
        bulk_insert_rows(rows, read_back=False)
        ids = [str(row.pk) for row in rows]
        transaction.on_commit(lambda: events_recorded.send(sender=None, event_ids=ids))
    return rows


# The (client, event type) pairs subscribed by an active endpoint, on
# PostgreSQL: the executor asks once per batch, and the queryset's compiling
# and its JSON loading were 0.3 ms of a batch's ~3 ms fixed cost
# (bench/executor_cost.py). An ``event_types`` that is not a list (written
# past the API's validation) subscribes to nothing, as it must not fail the
# batch of every client in it (DESIGN §8); the fan-out (``dispatch``) holds to
# the same rule.
_SUBSCRIPTIONS_SQL = """
SELECT DISTINCT ep.client_id, t.event_type
  FROM payments_webhookendpoint ep,
       jsonb_array_elements_text(CASE jsonb_typeof(ep.event_types)
                                 WHEN 'array' THEN ep.event_types ELSE '[]' END) AS t(event_type)
 WHERE ep.client_id = ANY(%b::bigint[]) AND ep.is_active
"""


def _subscriptions(clients: set[int]) -> set[tuple[int, str]]:
    """The ``(client id, event type)`` pairs of ``clients``' active endpoints."""
    if connection.vendor == "postgresql":
        with binary_cursor(binary_results=True) as cursor:
            cursor.execute(_SUBSCRIPTIONS_SQL, [[c for c in clients if c is not None]])
            return set(cursor.fetchall())
    return {
        (client_id, event_type)
        for client_id, types in WebhookEndpoint.objects.filter(
            client_id__in=clients, is_active=True
        ).values_list("client_id", "event_types")
        for event_type in _listed(types)
    }


def _listed(event_types) -> list:
    """An endpoint's ``event_types`` as subscriptions: a value that is not a list
    subscribes to nothing (``_SUBSCRIPTIONS_SQL``, ``_FAN_OUT_SQL``)."""
    return event_types if isinstance(event_types, list) else []


# Sent after commit with the ids of the events a transaction recorded
# (``event_ids``); ``payments.tasks`` publishes them to the webhook worker, so
# this module never publishes itself (tasks is the only publisher).
events_recorded = Signal()


@dataclass(frozen=True)
class Offer:
    """A delivery worth sending now; ``behind``: past its client's free share, so
    it is sent at ``BEHIND_PRIORITY`` (module docstring)."""

    delivery_id: str
    behind: bool


def offers(pairs: Iterable[tuple]) -> list[Offer]:
    """``(delivery id, client)`` pairs, in order, as offers: each client's first
    ``_ClientShares.free`` ahead, the rest behind."""
    free: dict = {}
    counted: Counter = Counter()
    made = []
    for delivery_id, client_id in pairs:
        if client_id not in free:
            free[client_id] = _client_shares.free(client_id)
        counted[client_id] += 1
        made.append(Offer(str(delivery_id), behind=counted[client_id] > free[client_id]))
    return made


def dispatch(event_ids) -> list[Offer]:
    """Expand events into one delivery per subscribed active endpoint (webhook worker).

    Each event is expanded once: its row is locked (``SKIP LOCKED``: another
    dispatcher has it) and stamped ``dispatched_at``, and UNIQUE (event,
    endpoint) backs that. Returns the new deliveries worth sending now, oldest
    event first: deliveries to an endpoint whose circuit is open — or
    has lapsed and awaits its probe — wait in the table, and the beat scan
    offers them once it closes (a dead endpoint costs no message per event).
    Each client's free share goes ahead, the rest ``behind`` (``offers``).
    """
    with transaction.atomic():
        events = list(
            WebhookEvent.objects.select_for_update(skip_locked=True)
            .filter(pk__in=list(event_ids), dispatched_at__isnull=True)
            .order_by("created_at")
        )
        if not events:
            return []
        now = timezone.now()
        if connection.vendor == "postgresql":
            created = _fan_out_sql([e.pk for e in events])
        else:
            created = _fan_out_python(events)
        WebhookEvent.objects.filter(pk__in=[e.pk for e in events]).update(dispatched_at=now)
    # Only endpoints whose circuit is closed: a lapsed circuit is half-open, and
    # the beat scan offers it its one probe (``due_delivery_ids``). Sending it
    # the whole expansion cost a task and a transaction per delivery only to
    # defer all but one (noisy bench: 50 dead endpoints kept the webhook worker
    # at 20 CPU-s per 4 min, mostly in ``_claim`` deferring).
    return offers((delivery, client_id) for delivery, client_id, closed in created if closed)


# The fan-out in one statement: the rows (and their payloads, the same JSON
# ``_fan_out_python`` builds, timestamps in ``ISO_TIMESTAMP_FORMAT``) never pass
# through Python. For 500 events x 10 endpoints the webhook worker spent 3.1 CPU-s
# (profiled) in bulk_create building 5,000 delivery objects and binding their
# payloads, right when the payment burst that emitted the events was running;
# now 0.15 s.
_FAN_OUT_SQL = """
WITH pairs AS (
    SELECT gen_random_uuid() AS id, ep.id AS endpoint_id, e.id AS event_id, e.client_id,
           e.event_type, e.data, e.created_at, ep.circuit_open_until IS NULL AS closed
      FROM payments_webhookevent e
      JOIN payments_webhookendpoint ep
        ON ep.client_id = e.client_id AND ep.is_active
       AND jsonb_typeof(ep.event_types) = 'array' AND ep.event_types ? e.event_type
     WHERE e.id = ANY(%s::uuid[])
), inserted AS (
    INSERT INTO payments_webhookdelivery
           (id, endpoint_id, event_id, event_type, payload, status, attempts, last_error)
    SELECT id, endpoint_id, event_id, event_type,
           jsonb_build_object(
               'id', id::text,
               'type', event_type,
               'created_at', to_char(created_at AT TIME ZONE 'UTC',
                                     'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
               'data', data),
           'pending', 0, ''
      FROM pairs
    RETURNING id
)
SELECT pairs.id, pairs.client_id, pairs.closed FROM pairs JOIN inserted USING (id)
 ORDER BY pairs.created_at, pairs.event_id, pairs.endpoint_id
"""


def _fan_out_sql(event_ids) -> list[tuple]:
    """(delivery id, client, endpoint's circuit closed?) for the deliveries made
    for ``event_ids``, oldest event first (PostgreSQL)."""
    with connection.cursor() as cursor:
        cursor.execute(_FAN_OUT_SQL, [list(event_ids)])
        return cursor.fetchall()


def _fan_out_python(events) -> list[tuple]:
    """``_fan_out_sql`` for SQLite (the embedded default)."""
    endpoints: dict[int, list] = {}
    for endpoint_id, client_id, types, open_until in WebhookEndpoint.objects.filter(
        client_id__in={e.client_id for e in events}, is_active=True
    ).values_list("pk", "client_id", "event_types", "circuit_open_until"):
        endpoints.setdefault(client_id, []).append((endpoint_id, types, open_until is None))
    deliveries, made = [], []
    for event in events:
        for endpoint_id, types, is_closed in endpoints.get(event.client_id, ()):
            if event.event_type not in _listed(types):
                continue
            delivery = WebhookDelivery(
                endpoint_id=endpoint_id, event=event, event_type=event.event_type
            )
            delivery.payload = {
                "id": str(delivery.id),
                "type": event.event_type,
                "created_at": iso_timestamp(event.created_at),
                "data": event.data,
            }
            deliveries.append(delivery)
            made.append((delivery.pk, event.client_id, is_closed))
    WebhookDelivery.objects.bulk_create(deliveries)
    return made


def undispatched_event_ids(*, older_than: float = 5.0, limit: int = 500) -> list[str]:
    """Events whose dispatch message was lost (broker down or flushed): the beat's
    safety net dispatches them."""
    cutoff = timezone.now() - timedelta(seconds=older_than)
    ids = WebhookEvent.objects.filter(dispatched_at__isnull=True, created_at__lte=cutoff)
    return [str(pk) for pk in ids.order_by("created_at").values_list("pk", flat=True)[:limit]]


def backoff(attempts: int) -> timedelta:
    return timedelta(seconds=min(settings.WEBHOOK_BACKOFF_SECONDS * 2 ** (attempts - 1), 3600))


def circuit_cooldown(opens: int) -> timedelta:
    """Cool-down after the ``opens``-th consecutive opening: doubling, capped at 1 h."""
    seconds = settings.WEBHOOK_CIRCUIT_COOLDOWN_SECONDS * 2 ** max(opens - 1, 0)
    return timedelta(seconds=min(seconds, 3600))


def _lease() -> timedelta:
    """How long a claimed delivery (or a circuit probe) is reserved: twice the
    request budget, so it is free again only after its request has ended."""
    return timedelta(seconds=settings.WEBHOOK_TIMEOUT_SECONDS * 2)


@dataclass
class _Claim:
    delivery: WebhookDelivery
    probe: bool  # this request decides whether the endpoint's open circuit closes


def _claim(delivery_id) -> _Claim | str | None:
    """Lock a due pending delivery and decide, under its endpoint's row lock,
    whether a request may be made now.

    Returns a ``_Claim`` (attempt counted, delivery leased) if so; otherwise
    the delivery's status after the decision: ``failed`` for an inactive
    endpoint, ``None`` when nothing is due or the endpoint's circuit is open
    (the delivery then waits for the circuit, no attempt spent, no request).
    The endpoint row lock (FOR NO KEY UPDATE: it does not block ``emit``'s
    inserts) makes the circuit decision one at a time per endpoint, however
    many threads claim its deliveries.
    """
    pending = WebhookDelivery.objects.filter(pk=delivery_id, status=DeliveryStatus.PENDING)
    with transaction.atomic():
        # The endpoint's row before the delivery's, as ``endpoint_delete`` and
        # the outcome's transaction take them: the other order deadlocked with
        # a delete (its cascade waiting on this delivery, this on its endpoint).
        endpoint = _locked_endpoint(pending.values_list("endpoint_id", flat=True).first())
        if endpoint is None:
            return None
        delivery = (
            pending.select_for_update(no_key=True, skip_locked=True, of=("self",))
            .filter(endpoint=endpoint)
            .first()
        )
        now = timezone.now()
        if delivery is None or delivery.next_attempt_at > now:
            return None
        delivery.endpoint = endpoint
        if delivery.attempts >= settings.WEBHOOK_MAX_ATTEMPTS:
            # Every attempt already counted, the last one's outcome never
            # recorded (its worker died or raised after the claim): given up
            # here, or the lease's expiry offered it again for ever.
            delivery.status = DeliveryStatus.FAILED
            delivery.last_error = delivery.last_error or ATTEMPT_ERROR
            delivery.save(update_fields=["status", "last_error"])
            _count("gave_up")
            return delivery.status
        if not endpoint.is_active:
            delivery.status = DeliveryStatus.FAILED
            delivery.last_error = ENDPOINT_DISABLED
            delivery.save(update_fields=["status", "last_error"])
            _count(ENDPOINT_DISABLED)
            return delivery.status
        probe = False
        if endpoint.circuit_open_until is not None:
            if endpoint.circuit_open_until > now:
                delivery.next_attempt_at = endpoint.circuit_open_until
                delivery.last_error = CIRCUIT_OPEN
                delivery.save(update_fields=["next_attempt_at", "last_error"])
                _count(CIRCUIT_OPEN)
                return None
            # Cool-down over: this delivery probes; until its outcome (or its
            # lease) the circuit stays open for every other delivery.
            endpoint.circuit_open_until = now + _lease()
            endpoint.save(update_fields=["circuit_open_until"])
            probe = True
        delivery.attempts += 1
        delivery.next_attempt_at = now + _lease()
        # in flight, not waiting for a circuit: a circuit reset
        # (``endpoint_update``) must not make it due again meanwhile
        delivery.last_error = ""
        delivery.save(update_fields=["attempts", "next_attempt_at", "last_error"])
    return _Claim(delivery, probe)


def _locked_endpoint(endpoint_id) -> WebhookEndpoint | None:
    """The endpoint's row, locked FOR NO KEY UPDATE (``emit``'s inserts pass, a
    delete waits); None when it is gone. Caller is inside a transaction."""
    if endpoint_id is None:
        return None
    return WebhookEndpoint.objects.select_for_update(no_key=True).filter(pk=endpoint_id).first()


def _record_circuit(endpoint: WebhookEndpoint, *, ok: bool, probe: bool) -> None:
    """Count the outcome of one request against its endpoint's circuit; the
    caller holds the endpoint's row lock (``_locked_endpoint``)."""
    now = timezone.now()
    if ok:
        endpoint.consecutive_failures = 0
        endpoint.circuit_open_until = None
        endpoint.circuit_opens = 0
    else:
        endpoint.consecutive_failures += 1
        closed_or_lapsed = endpoint.circuit_open_until is None or endpoint.circuit_open_until <= now
        if probe or (
            closed_or_lapsed and endpoint.consecutive_failures >= settings.WEBHOOK_CIRCUIT_FAILURES
        ):
            endpoint.circuit_opens += 1
            endpoint.circuit_open_until = now + circuit_cooldown(endpoint.circuit_opens)
            logger.warning(
                "webhook endpoint %s: circuit open until %s after %d consecutive failures",
                endpoint.pk,
                endpoint.circuit_open_until.isoformat(),
                endpoint.consecutive_failures,
            )
    endpoint.save(update_fields=["consecutive_failures", "circuit_open_until", "circuit_opens"])


# Sent with the id of a delivery put off to its client's turn when that turn
# comes (a request of the client ended in this process); ``payments.tasks``
# publishes it to the webhook worker.
turn_came = Signal()


class _ClientShares:
    """This process's requests per client, and the line of deliveries waiting for one.

    A request may start while the client's requests in flight (and slots
    promised to deliveries whose turn came) are fewer than
    ``WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT`` and no delivery of the client waits in
    line (a delivery back at its turn goes first). Otherwise the delivery joins
    the client's line and is put off; each request of the client that ends
    here promises its slot to the first in line (``turn_came``): put off once,
    sent the moment a slot is free, first come first served. A promise not
    taken up within ``PROMISE_SECONDS`` (the delivery went to another
    process) lapses, and the next delivery or beat scan in this process
    hands its slot on (``hand_on_lapsed``).
    """

    PROMISE_SECONDS = 30.0

    def __init__(self):
        self._lock = threading.Lock()
        self._in_flight: Counter = Counter()
        self._lines: dict[object, OrderedDict] = {}
        self._promised: dict[object, dict] = {}

    def _promises(self, client_id) -> dict:
        promised = self._promised.get(client_id, {})
        now = time.monotonic()
        for delivery_id in [d for d, lapses in promised.items() if lapses <= now]:
            del promised[delivery_id]
        return promised

    def take(self, client_id, delivery_id, *, returning: bool, until) -> bool:
        """True: start now (in flight until ``done``). False: ``delivery_id`` waits
        in line, put off ``until`` (the caller writes it; its turn hands it on
        only while it is still put off to that instant)."""
        share = settings.WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT
        with self._lock:
            promised = self._promises(client_id)
            line = self._lines.get(client_id)
            busy = self._in_flight[client_id] + len(promised)
            if delivery_id in promised or (busy < share and (returning or not line)):
                promised.pop(delivery_id, None)
                if line is not None:
                    line.pop(delivery_id, None)
                self._in_flight[client_id] += 1
                self._tidy(client_id)
                return True
            line = self._lines.setdefault(client_id, OrderedDict())
            line[delivery_id] = [until, False]  # handed on once ``put_off`` says it is
            if returning:
                line.move_to_end(delivery_id, last=False)
            return False

    def free(self, client_id) -> int:
        """Requests the client may start here now without waiting: none while any
        of its deliveries waits in line."""
        with self._lock:
            if self._lines.get(client_id):
                return 0
            busy = self._in_flight.get(client_id, 0) + len(self._promises(client_id))
            return max(0, settings.WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT - busy)

    def put_off(self, client_id, delivery_id) -> None:
        """The delivery's put-off is written: its turn may come now."""
        with self._lock:
            entry = self._lines.get(client_id, {}).get(delivery_id)
            if entry is not None:
                entry[1] = True

    def done(self, client_id) -> None:
        """A request of the client ended."""
        with self._lock:
            self._in_flight[client_id] -= 1
            self._tidy(client_id)

    def next_in_line(self, client_id):
        """``(delivery_id, until)`` of the first in line whose put-off is written, a
        slot promised to it, if a slot is free; else None."""
        share = settings.WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT
        with self._lock:
            promised = self._promises(client_id)
            line = self._lines.get(client_id)
            if not line or self._in_flight[client_id] + len(promised) >= share:
                return None
            ready = next((d for d, (_, written) in line.items() if written), None)
            if ready is None:
                return None
            until, _ = line.pop(ready)
            delivery_id = ready
            promised[delivery_id] = time.monotonic() + self.PROMISE_SECONDS
            self._promised[client_id] = promised
            self._tidy(client_id)
            return delivery_id, until

    def lapsed(self) -> list:
        """Clients with a promise that lapsed (not yet seen by their own next
        ``take`` or ``next_in_line``) and deliveries still in line: the slot it
        held is free, and nothing of the client in this process may come to
        hand it on."""
        with self._lock:
            now = time.monotonic()
            clients = []
            for client_id, promised in list(self._promised.items()):
                gone = [d for d, lapses in promised.items() if lapses <= now]
                for delivery_id in gone:
                    del promised[delivery_id]
                if gone and self._lines.get(client_id):
                    clients.append(client_id)
                self._tidy(client_id)
            return clients

    def forget(self, client_id, delivery_id) -> None:
        """``delivery_id`` waits no more (it moved on): out of the line, no promise."""
        with self._lock:
            if client_id in self._lines:
                self._lines[client_id].pop(delivery_id, None)
            if client_id in self._promised:
                self._promised[client_id].pop(delivery_id, None)
            self._tidy(client_id)

    def _tidy(self, client_id) -> None:
        """Nothing kept for a client with nothing in flight, waiting or promised."""
        if self._in_flight[client_id] <= 0:
            del self._in_flight[client_id]
        for held in (self._lines, self._promised):
            if client_id in held and not held[client_id]:
                del held[client_id]


_client_shares = _ClientShares()


def deliver(delivery_id) -> str | None:
    """Try one delivery now if it is due, its endpoint allows it and its client
    has a share of this process's requests free.

    Returns the delivery's status after the try (``succeeded``, ``pending``
    for a retry later, ``failed``), ``client_busy`` when it was put off to wait
    for its client's turn (no attempt spent), or ``None`` when no request was
    made (not due, claimed elsewhere, or deferred by the endpoint's open
    circuit).
    """
    row = (
        WebhookDelivery.objects.filter(pk=delivery_id)
        .values_list("endpoint__client_id", "last_error")
        .first()
    )
    if row is None:
        return None
    client_id, last_error = row
    delivery_id = str(delivery_id)
    hand_on_lapsed()
    now = timezone.now()
    # Put off this long at most: if this process dies with the line, the beat's
    # scan sends the delivery again once it is due.
    until = now + timedelta(seconds=TURN_FALLBACK_SECONDS)
    if not _client_shares.take(
        client_id, delivery_id, returning=last_error == CLIENT_BUSY, until=until
    ):
        try:
            put_off = WebhookDelivery.objects.filter(
                pk=delivery_id, status=DeliveryStatus.PENDING, next_attempt_at__lte=now
            ).update(next_attempt_at=until, last_error=CLIENT_BUSY)
        except BaseException:  # not written: it must not stay in line (nothing hands it on)
            _client_shares.forget(client_id, delivery_id)
            raise
        if not put_off:
            _client_shares.forget(client_id, delivery_id)
            return None
        _count(CLIENT_BUSY)
        _client_shares.put_off(client_id, delivery_id)
        _hand_on(client_id)  # a slot may have freed while the put-off was written
        return CLIENT_BUSY
    try:
        return _deliver(delivery_id)
    finally:
        _client_shares.done(client_id)
        _hand_on(client_id)


def hand_on_lapsed() -> None:
    """Slots promised here to a delivery that never came to take them up (its turn
    message went to another webhook process, or was lost and the beat's scan
    sent it elsewhere) lapse after ``PROMISE_SECONDS``; their clients' lines
    move on. Run by every delivery in this process and the beat's scan: a
    client with nothing else going on here would otherwise wait for the
    fallback (``TURN_FALLBACK_SECONDS``, 10 minutes)."""
    for client_id in _client_shares.lapsed():
        _hand_on(client_id)


def _hand_on(client_id) -> None:
    """Free slots of ``client_id`` go to the first in its line that still wait: each
    is made due now and sent (``turn_came``). One that moved on meanwhile (sent
    from elsewhere after the beat's scan) gives its turn to the next."""
    try:
        while (first := _client_shares.next_in_line(client_id)) is not None:
            waiting_id, until = first
            came = WebhookDelivery.objects.filter(
                pk=waiting_id, status=DeliveryStatus.PENDING, next_attempt_at=until
            ).update(next_attempt_at=timezone.now())
            if came:
                turn_came.send(sender=None, delivery_id=waiting_id)
            else:
                _client_shares.forget(client_id, waiting_id)
    except Exception:  # the line waits for the fallback (the beat's scan), never lost
        logger.warning("webhook turns of client %s not handed on", client_id, exc_info=True)


def _deliver(delivery_id) -> str | None:
    claim = _claim(delivery_id)
    if not isinstance(claim, _Claim):
        return claim
    delivery = claim.delivery
    started = time.monotonic()
    try:
        outcome = _attempt(delivery)
    except Exception:  # ours, not the endpoint's: recorded as an attempt like any other
        logger.exception("webhook delivery %s: the attempt raised", delivery.pk)
        outcome = webhook_transport.Outcome(None, ATTEMPT_ERROR)
    duration_ms = int((time.monotonic() - started) * 1000)
    with transaction.atomic():
        # The endpoint first (see ``_claim``): a delete that came first leaves
        # nothing to record; one that comes after waits, then sees this attempt
        # (it used to miss it and fail at commit: a 500 for the client).
        endpoint = _locked_endpoint(delivery.endpoint_id)
        if endpoint is None:
            return None
        # The claim still the delivery's (the fence: pending, this attempt's
        # number): else another claim took it meanwhile and its outcome decides;
        # this request is only logged (it was made).
        current = (
            WebhookDelivery.objects.select_for_update(no_key=True)
            .filter(pk=delivery.pk)
            .values_list("status", "attempts")
            .first()
        )
        if current is None:
            return None
        WebhookAttempt.objects.create(
            delivery=delivery,
            number=delivery.attempts,
            status_code=outcome.status_code,
            error=outcome.error,
            duration_ms=duration_ms,
        )
        if current != (DeliveryStatus.PENDING, delivery.attempts):
            logger.warning(
                "webhook delivery %s: claimed again while attempt %s was in flight; "
                "that attempt is logged, not applied",
                delivery.pk,
                delivery.attempts,
            )
            return None
        delivery.last_status_code = outcome.status_code
        delivery.last_error = outcome.error
        gave_up = False
        if outcome.ok:
            delivery.status = DeliveryStatus.SUCCEEDED
            delivery.delivered_at = timezone.now()
        elif delivery.attempts >= settings.WEBHOOK_MAX_ATTEMPTS:
            delivery.status = DeliveryStatus.FAILED
            gave_up = True
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
        # the endpoint's circuit, for the URL this request went to: one changed
        # meanwhile starts with a closed circuit (``endpoint_update``)
        if outcome.error not in OUR_ERRORS and endpoint.url == delivery.endpoint.url:
            _record_circuit(endpoint, ok=outcome.ok, probe=claim.probe)
    _count("succeeded" if outcome.ok else "failed_attempt")
    if gave_up:
        _count("gave_up")
    return delivery.status


def _attempt(delivery: WebhookDelivery) -> webhook_transport.Outcome:
    """Sign and POST one delivery (its endpoint on it)."""
    body = json.dumps(delivery.payload, separators=(",", ":"), sort_keys=True).encode()
    timestamp = int(time.time())
    try:
        secret = webhook_secrets.decrypt(delivery.endpoint.secret_ciphertext)
    except webhook_secrets.InvalidToken:
        logger.error("webhook endpoint %s: secret cannot be decrypted", delivery.endpoint_id)
        return webhook_transport.Outcome(None, SECRET_UNAVAILABLE)
    return webhook_transport.post(
        delivery.endpoint.url,
        body,
        {
            "Content-Type": "application/json",
            "User-Agent": "delayed-payment-scheduler-webhooks/1",
            "Webhook-Id": str(delivery.pk),
            "Webhook-Timestamp": str(timestamp),
            "Webhook-Signature": sign(secret, timestamp, body),
        },
        budget=settings.WEBHOOK_TIMEOUT_SECONDS,
    )


def retry_delay(delivery_id) -> float:
    """Seconds until the delivery's next attempt is due (0 if it already is)."""
    due = WebhookDelivery.objects.values_list("next_attempt_at", flat=True).get(pk=delivery_id)
    return max((due - timezone.now()).total_seconds(), 0.0)


def _count(outcome: str) -> None:
    metrics.webhook_deliveries.labels(outcome=outcome).inc()


def due_offers(limit: int = 500) -> list[Offer]:
    """``due_delivery_ids`` as offers: a backlog the scan finds (a burst still in
    the queue is due too) goes behind past its client's free share, or its copies
    would stand ahead of every other client's webhooks once a scan."""
    ids = due_delivery_ids(limit)
    client_of = {
        str(pk): client_id
        for pk, client_id in WebhookDelivery.objects.filter(pk__in=ids).values_list(
            "pk", "endpoint__client_id"
        )
    }
    return offers((pk, client_of[pk]) for pk in ids if pk in client_of)


def due_delivery_ids(limit: int = 500) -> list[str]:
    """Pending deliveries whose time has come, for endpoints that may be called.

    Taken in turns across endpoints (DESIGN §8): each endpoint's oldest due
    delivery first, then each one's second, and so on, oldest first within a
    turn. Taken oldest first over all endpoints, one client's backlog — an
    endpoint back after a day's outage, 100,000 due — filled every scan, and
    another client's due delivery waited until all of it had gone, 500 every
    10 s: half an hour (a reviewer's probe: 1,200 ahead of it, offered at the
    third scan).

    Left out: endpoints whose circuit is open (``deliver`` would only defer
    them again). An endpoint whose circuit has lapsed gets one delivery — its
    probe; the rest of its backlog is offered once the probe closes the
    circuit. Offering the whole backlog would cost a task per delivery only to
    defer all but one (measured: 50 dead endpoints kept the webhook worker
    at a third of a core).
    """
    now = timezone.now()
    due = WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
    closed = _closed_in_turns(now, limit)
    probes = list(
        due.filter(endpoint__circuit_open_until__lte=now)
        .order_by("endpoint_id", "next_attempt_at")
        .distinct("endpoint_id")
        .values_list("pk", flat=True)[:limit]
        if connection.vendor == "postgresql"
        else _first_per_endpoint(due.filter(endpoint__circuit_open_until__lte=now), limit)
    )
    # Probes first, up to half the offer: a backlog of due deliveries at
    # closed endpoints (one client's burst) took the whole offer and no
    # recovered endpoint got its probe while it lasted (a review, session 42).
    half = limit // 2
    return [str(pk) for pk in [*probes[:half], *closed, *probes[half:]][:limit]]


FINISHED = (DeliveryStatus.SUCCEEDED, DeliveryStatus.FAILED)


def purge_finished(*, batch: int = 1000, budget_seconds: float = 60.0) -> int:
    """Delete the finished deliveries (succeeded or failed) made more than
    ``WEBHOOK_RETENTION_DAYS`` ago with their attempts, then the events
    dispatched before then that no delivery refers to any more (those of a
    deleted endpoint included); oldest first, ``batch`` a transaction, until
    none is left or ``budget_seconds`` have passed (the next hourly run goes
    on). Pending deliveries are never touched. Each batch takes its
    deliveries' endpoint rows first, as claims, outcomes and deletes do, and
    skips those another transaction holds (an endpoint being deleted, one
    recording an attempt): the purge never waits and never deadlocks with
    them. Returns the deliveries deleted."""
    days = settings.WEBHOOK_RETENTION_DAYS
    if days <= 0:
        return 0
    cutoff = timezone.now() - timedelta(days=days)
    deadline = time.monotonic() + budget_seconds
    old = (
        WebhookDelivery.objects.filter(status__in=FINISHED, created_at__lt=cutoff)
        .select_related("endpoint")
        .only("id", "endpoint__id")
        .order_by("created_at")
        .select_for_update(no_key=True, skip_locked=True, of=("endpoint",))
    )

    def deliveries() -> int:
        return _delete_deliveries([delivery.pk for delivery in old[:batch]])

    orphans = (
        WebhookEvent.objects.filter(dispatched_at__lt=cutoff)
        .exclude(Exists(WebhookDelivery.objects.filter(event=OuterRef("pk"))))
        .order_by("dispatched_at")
        .values_list("pk", flat=True)
    )

    def events_left_alone() -> int:
        ids = list(orphans[:batch])
        WebhookEvent.objects.filter(pk__in=ids).delete()
        return len(ids)

    deleted = in_batches(deliveries, batch, deadline)
    events = in_batches(events_left_alone, batch, deadline)
    if deleted or events:
        logger.info(
            "purged %s webhook deliveries and %s events older than %s days", deleted, events, days
        )
    return deleted


def _delete_deliveries(ids: list) -> int:
    """Delete the deliveries ``ids`` with their attempts (the caller's transaction);
    how many ids there were."""
    WebhookAttempt.objects.filter(delivery_id__in=ids).delete()
    WebhookDelivery.objects.filter(pk__in=ids).delete()
    return len(ids)


def _closed_in_turns(now, limit: int) -> list:
    """Up to ``limit`` due deliveries of closed-circuit endpoints, in turns: each
    endpoint's oldest first, then each one's second…, oldest first within a turn.

    Read so that the cost is the endpoints and the offer, not the backlog (one
    endpoint's 500 each, sorted, was 500,000 rows and 0.9 s a scan for 1,000
    endpoints behind: a reviewer's measure): every endpoint with something due
    gets an equal share of the offer first; if that leaves the offer short,
    those that had more than their share fill it, in the same turns."""
    endpoints = _due_closed_endpoints(now)
    if not endpoints:
        return []
    share = -(-limit // len(endpoints))  # ceil
    rows = _turns(endpoints, now, share, offset=0)
    if len(rows) < limit and share < limit:
        taken = Counter(endpoint_id for _, endpoint_id, _, _ in rows)
        full = [endpoint_id for endpoint_id, count in taken.items() if count == share]
        if full:
            rows += _turns(full, now, limit - len(rows), offset=share)
    rows.sort(key=lambda row: (row[2], row[3]))
    return [row[0] for row in rows[:limit]]


# The closed-circuit endpoints with a delivery due: one probe of
# ``webhook_pending_by_endpoint`` each.
_DUE_CLOSED_ENDPOINTS_SQL = """
SELECT ep.id FROM payments_webhookendpoint ep
 WHERE ep.circuit_open_until IS NULL
   AND EXISTS (SELECT 1 FROM payments_webhookdelivery d
                WHERE d.endpoint_id = ep.id AND d.status = 'pending' AND d.next_attempt_at <= %s)
"""

# (id, endpoint, turn, due time) of each endpoint's due deliveries, ``offset`` skipped
# and at most ``count`` each: one range of ``webhook_pending_by_endpoint`` each.
_TURNS_SQL = """
SELECT d.id, ep.id, d.turn, d.next_attempt_at
  FROM unnest(%s::uuid[]) AS ep(id)
 CROSS JOIN LATERAL (
        SELECT d.id, d.next_attempt_at,
               %s + row_number() OVER (ORDER BY d.next_attempt_at) AS turn
          FROM payments_webhookdelivery d
         WHERE d.endpoint_id = ep.id AND d.status = 'pending' AND d.next_attempt_at <= %s
         ORDER BY d.next_attempt_at
         OFFSET %s LIMIT %s
       ) d
"""


def _due_closed_endpoints(now) -> list:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_DUE_CLOSED_ENDPOINTS_SQL, [now])
            return [row[0] for row in cursor.fetchall()]
    return list(  # SQLite (the embedded default's scale)
        WebhookDelivery.objects.filter(
            status=DeliveryStatus.PENDING,
            next_attempt_at__lte=now,
            endpoint__circuit_open_until__isnull=True,
        )
        .values_list("endpoint_id", flat=True)
        .distinct()
    )


def _turns(endpoints, now, count: int, *, offset: int) -> list[tuple]:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_TURNS_SQL, [list(endpoints), offset, now, offset, count])
            return [tuple(row) for row in cursor.fetchall()]
    rows = []  # SQLite: a query an endpoint
    for endpoint_id in endpoints:
        due = (
            WebhookDelivery.objects.filter(
                endpoint_id=endpoint_id, status=DeliveryStatus.PENDING, next_attempt_at__lte=now
            )
            .order_by("next_attempt_at")
            .values_list("pk", "next_attempt_at")[offset : offset + count]
        )
        rows += [(pk, endpoint_id, offset + k, at) for k, (pk, at) in enumerate(due, start=1)]
    return rows


def _first_per_endpoint(deliveries, limit: int) -> list:
    """``DISTINCT ON (endpoint_id)`` for SQLite: the oldest due delivery of each endpoint."""
    first: dict = {}
    for pk, endpoint_id in deliveries.order_by("next_attempt_at").values_list("pk", "endpoint_id"):
        first.setdefault(endpoint_id, pk)
        if len(first) >= limit:
            break
    return list(first.values())


def payment_data(payment) -> dict:
    def iso(value):
        return iso_timestamp(value) if value else None

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


def _checked_url(url: str) -> str:
    try:
        return webhook_transport.check_url(url)
    except webhook_transport.UrlRefused as exc:
        raise InvalidRequest(str(exc), fields={"url": [str(exc)]}) from None


def endpoint_create(*, client, url: str, event_types: list[str]) -> WebhookEndpoint:
    """Register an endpoint; the returned instance carries the plaintext signing
    secret in ``.secret`` (shown to the client once, stored only encrypted).

    The URL is checked (DNS included) before any lock is taken. The client's
    user row is locked while counting, so concurrent creates cannot pass
    ``WEBHOOK_MAX_ENDPOINTS_PER_CLIENT`` together.
    """
    url = _checked_url(url)
    secret = new_secret()
    with transaction.atomic():
        get_user_model().objects.select_for_update(no_key=True).filter(pk=client.pk).first()
        limit = settings.WEBHOOK_MAX_ENDPOINTS_PER_CLIENT
        if WebhookEndpoint.objects.filter(client=client).count() >= limit:
            raise LimitExceeded(
                f"A client can have at most {limit} webhook endpoints; delete one first.",
                limit=limit,
            )
        endpoint = WebhookEndpoint.objects.create(
            client=client,
            url=url,
            secret_ciphertext=webhook_secrets.encrypt(secret),
            event_types=sorted(set(event_types)),
        )
    endpoint.secret = secret
    return endpoint


def endpoint_get(*, client, endpoint_id) -> WebhookEndpoint:
    return _owned(client, endpoint_id, lock=False)


def endpoint_update(*, client, endpoint_id, **changes) -> WebhookEndpoint:
    """Change url, event types or is_active; a new URL is checked like at creation.

    Deactivating stops new events at once (``emit`` skips the endpoint);
    deliveries already queued are failed ``endpoint_disabled`` when a worker
    reaches them, without a request.
    """
    if "url" in changes:
        changes["url"] = _checked_url(changes["url"])
    if "event_types" in changes:
        changes["event_types"] = sorted(set(changes["event_types"]))
    with transaction.atomic():
        endpoint = _owned(client, endpoint_id, lock=True)
        # A new URL, or the endpoint switched back on, starts with its circuit
        # closed: the fix of a typo'd URL waited out the old one's cool-down
        # (up to an hour), and so did the deliveries it had put off.
        fresh = changes.get("url", endpoint.url) != endpoint.url or (
            changes.get("is_active") and not endpoint.is_active
        )
        for name, value in changes.items():
            setattr(endpoint, name, value)
        fields = list(changes)
        if fresh and (endpoint.circuit_open_until or endpoint.consecutive_failures):
            endpoint.consecutive_failures = endpoint.circuit_opens = 0
            endpoint.circuit_open_until = None
            fields += ["consecutive_failures", "circuit_opens", "circuit_open_until"]
            put_off = WebhookDelivery.objects.filter(
                endpoint=endpoint,
                status=DeliveryStatus.PENDING,
                last_error=CIRCUIT_OPEN,
                next_attempt_at__gt=timezone.now(),
            ).values("pk")[:REOPENED_DELIVERIES_LIMIT]
            WebhookDelivery.objects.filter(pk__in=put_off).update(next_attempt_at=timezone.now())
        endpoint.save(update_fields=fields)
    return endpoint


# deliveries put off by the old circuit made due at once by a reset (bounded:
# the rest come at their time, the circuit's end)
REOPENED_DELIVERIES_LIMIT = 1000


def _owned(client, endpoint_id, *, lock: bool, key: bool = False) -> WebhookEndpoint:
    """``client``'s endpoint, locked when ``lock`` (caller in a transaction):
    ``FOR NO KEY UPDATE``, as claims and outcomes lock it, or ``FOR UPDATE``
    with ``key`` (to delete it). A change takes the weaker one: ``FOR UPDATE``
    conflicts with the key-share lock that inserting a delivery takes on its
    endpoint, so one client's endpoint update held up the fan-out of every
    event dispatched in the same batch, other clients' included (a reviewer's
    probe: 4 s for 4 s of lock)."""
    endpoints = WebhookEndpoint.objects.filter(client=client, pk=endpoint_id)
    if lock:
        endpoints = endpoints.select_for_update(no_key=not key)
    endpoint = endpoints.first()
    if endpoint is None:
        raise NotFound(f"Webhook endpoint {endpoint_id} not found.")
    return endpoint


# An endpoint's history is deleted this many deliveries (with their attempts) a
# transaction (``endpoint_delete``).
DELETE_HISTORY_BATCH = 2000


def endpoint_delete(*, client, endpoint_id) -> None:
    """Delete an endpoint with its deliveries and their attempts, in three steps
    so that its history, however long, holds up no one else's webhooks (DESIGN
    §8). In one transaction the endpoint row was locked ``FOR UPDATE`` for the
    whole cascade — 27 s for 200,000 deliveries, more for a busy endpoint's 30
    days — and every fan-out batch holding one of the client's events waited
    for it, other clients' events included (a reviewer's finding).

    1. switched off, committed: from then on no event fans out to it, and a
       worker fails what is pending of it without a request;
    2. its deliveries and their attempts deleted ``DELETE_HISTORY_BATCH`` a
       transaction, each under the row's ``FOR NO KEY UPDATE`` (as a worker
       recording an attempt holds it: never a delivery gaining an attempt
       while it goes), which a fan-out's insert does not wait for;
    3. the row locked ``FOR UPDATE`` — waiting only for a worker or a fan-out
       in flight — what they added deleted, and the row with it. A delete that
       did not wait for the worker missed its new attempt and failed at commit
       (500).

    A failure part-way (the database gone) leaves the endpoint switched off
    with part of its history: deleting it again finishes the job."""
    with transaction.atomic():
        endpoint = _owned(client, endpoint_id, lock=True)
        if endpoint.is_active:
            endpoint.is_active = False
            endpoint.save(update_fields=["is_active"])
    history = WebhookDelivery.objects.filter(endpoint_id=endpoint_id).values_list("pk", flat=True)

    def deliveries() -> int:
        _owned(client, endpoint_id, lock=True)  # as a worker recording an attempt holds it
        return _delete_deliveries(list(history[:DELETE_HISTORY_BATCH]))

    in_batches(deliveries, DELETE_HISTORY_BATCH, deadline=float("inf"))
    with transaction.atomic():
        _owned(client, endpoint_id, lock=True, key=True).delete()
