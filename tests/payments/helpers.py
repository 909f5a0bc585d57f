"""Helpers for engine tests: make payments due, claim them, capture published messages;
and for migration tests: migrate the test database to a given state."""

from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from ledger.services import LedgerBatch
from payments import clock, services, tasks, transitions
from payments.clock import db_now
from payments.engine import sweeper
from payments.exceptions import PaymentNotCancellable
from payments.models import Actor, Payment, RecurringPayment
from tests.concurrency import run_in_threads


def make_due(*payment_ids, seconds_ago=1):
    when = timezone.now() - timedelta(seconds=seconds_ago)
    Payment.objects.filter(pk__in=payment_ids).update(due_at=when, run_at=when)


class Published(list):
    """Messages the sweeper would have sent: (queue, items, countdown); the
    ``partitions`` argument of each is in ``partitions``, and all its keyword
    arguments in ``kwargs``, in the same order."""

    def __init__(self):
        super().__init__()
        self.kwargs = []

    @property
    def partitions(self):
        return [kwargs.get("partitions") for kwargs in self.kwargs]

    def items(self):
        return [tuple(item) for _, items, _ in self for item in items]


def slot_start():
    """Now, rounded down to the start of its slot of the spread grid (``clock.spread_grid``)."""
    return clock.slot_start(timezone.now(), clock.spread())


def claim_batch(limit, lookahead=None):
    """The sweeper's claim (PENDING → QUEUED), without publishing; caller's transaction."""
    if lookahead is None:
        lookahead = settings.PAYMENT_LOOKAHEAD_SECONDS
    return transitions.claim_due(limit=limit, lookahead=lookahead)


def publish_claims(claims):
    """Publish claims as the sweeper does (one message per chunk)."""
    now = db_now()
    return tasks.publish_chunks(sweeper.chunk_claims(claims, now), now)


def capture_publish(monkeypatch) -> Published:
    published = Published()

    def fake_apply_async(args, queue, countdown=None, kwargs=None, **options):
        published.append((queue, args[0], countdown))
        published.kwargs.append(kwargs or {})

    monkeypatch.setattr(tasks.execute_chunk, "apply_async", fake_apply_async)
    return published


def sweep(monkeypatch):
    published = capture_publish(monkeypatch)
    result = sweeper.sweep_due(publish=tasks.publish_chunks)
    return result, published


def bulk_schedule(*, sources, targets, count, amount, due_at):
    """Create ``count`` funded PENDING payments fast (one transaction, bulk inserts).

    Same rows the API would write (``transitions.schedule_many``: holds
    through the ledger, a ``scheduled`` event each), minus the per-request
    overhead; round-robin over sources and targets.
    """
    now = db_now()  # one instant, as the column default gives a bulk insert
    items = [
        {
            "from_account_id": sources[i % len(sources)],
            "to_account_id": targets[i % len(targets)],
            "amount": amount,
            "due_at": due_at,
            "now": now,
        }
        for i in range(count)
    ]
    with transaction.atomic():
        batch = LedgerBatch(account_ids=sources)
        payments = transitions.schedule_many(batch, items, actor=Actor.CLIENT)
    return [str(p.pk) for p in payments]


def make_schedule(source, target, *, start, every=3600, **fields):
    """A recurring schedule between two account ids, created directly (as if the
    service had been down since ``start`` when that is in the past)."""
    return RecurringPayment.objects.create(
        from_account_id=source,
        to_account_id=target,
        amount=fields.pop("amount", 10),
        interval_seconds=every,
        start_time=start,
        next_run_at=fields.pop("next_run_at", start),
        **fields,
    )


def race_cancel(execute, payment_id, owner):
    """Run ``execute()`` and ``owner``'s cancel of ``payment_id`` in two threads
    released at the same instant. Returns (errors, what the cancel told its
    caller: ("cancelled", status) or ("refused", status named by the refusal))."""
    answer = []

    def cancel():
        try:
            payment = services.payment_cancel(payment_id=payment_id, client=owner, actor_user=owner)
            answer.append(("cancelled", payment.status))
        except PaymentNotCancellable as exc:
            answer.append(("refused", exc.details["status"]))

    errors = run_in_threads(lambda index: (execute, cancel)[index](), 2, timeout=30)
    return errors, (answer[0] if answer else None)


def migrate(targets):
    """Migrate the test database to ``targets`` (``[(app, migration name)]``);
    the apps of that state, for building rows as they were then."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def constraints(table: str) -> dict:
    """Every index and constraint of ``table``: name -> (columns, unique, index,
    foreign key target)."""
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, table)
    return {
        name: (tuple(c["columns"]), c["unique"], c["index"], c["foreign_key"])
        for name, c in found.items()
    }


def foreign_keys(schema: dict) -> set:
    """The (columns, target) of the foreign keys in ``constraints``' answer."""
    return {(columns, foreign_key) for columns, _, _, foreign_key in schema.values() if foreign_key}
