"""payments.transitions: each transition's guard, what it writes and what it refuses.

The engine and service tests drive these through the timer and the API; here
each transition is called directly on a row, so a guard that stopped
refusing, a field left unsaved or an event that lost its data shows up even
where the callers check first.
"""

from datetime import timedelta

import pytest
from django.db import transaction

from ledger.exceptions import LedgerError
from ledger.models import Account, Hold, HoldStatus
from ledger.services import LedgerBatch
from payments import services, transitions
from payments.clock import db_now, iso_timestamp
from payments.exceptions import PaymentNotCancellable, PaymentNotModifiable, RecurringNotChangeable
from payments.models import (
    DEAD_LETTER_CODE,
    Actor,
    Payment,
    PaymentStatus,
    RecurringPayment,
    RecurringStatus,
)
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def scheduled(client, **overrides) -> Payment:
    pid = client.schedule(**overrides).json()["payment_id"]
    return Payment.objects.select_related("from_account").get(pk=pid)


def set_status(payment: Payment, status: str, **fields) -> Payment:
    """The row moved to ``status`` (in memory only for COMPLETED, which the
    database accepts only with its journal entry)."""
    if status == PaymentStatus.COMPLETED:
        payment.status = status
        return payment
    Payment.objects.filter(pk=payment.pk).update(status=status, **fields)
    return Payment.objects.select_related("from_account").get(pk=payment.pk)


def refusal(raised, exc_class, message, **details):
    assert type(raised.value) is exc_class
    assert raised.value.message == message
    assert raised.value.details == details


# --- executed: complete / fail ---------------------------------------------------------


@pytest.mark.parametrize("finish", ["complete", "fail"])
@pytest.mark.parametrize("status", ["PENDING", "COMPLETED", "CANCELLED"])
def test_only_a_queued_payment_can_be_completed_or_failed(alice, finish, status):
    payment = set_status(scheduled(alice), status)
    with pytest.raises(PaymentNotModifiable) as raised:
        if finish == "complete":
            transitions.complete(payment, entry=None, now=db_now(), worker="w")
        else:
            transitions.fail(payment, code="x", message="y", now=db_now(), worker="w")
    refusal(
        raised,
        PaymentNotModifiable,
        f"Payment {payment.pk} is {status}, not QUEUED.",
        status=status,
    )
    assert payment.status == status  # nothing changed in memory either


def test_a_failure_message_is_cut_to_the_column(alice):
    payment = set_status(scheduled(alice), "QUEUED")
    now = db_now()
    event = transitions.fail(payment, code="frozen", message="m" * 300, now=now, worker="w")
    assert payment.error_message == "m" * 255
    assert (payment.status, payment.error_code, payment.lease_expires_at) == (
        "FAILED",
        "frozen",
        None,
    )
    assert (event.type, event.from_status, event.to_status) == ("failed", "QUEUED", "FAILED")
    assert event.data == {"worker": "w", "error_code": "frozen"}


# --- claim_now -------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["COMPLETED", "FAILED", "CANCELLED"])
def test_claim_now_refuses_a_payment_that_is_no_longer_open(alice, status):
    payment = set_status(scheduled(alice), status)
    with pytest.raises(PaymentNotModifiable) as raised:
        transitions.claim_now(payment, now=db_now(), execution_id="op-1")
    refusal(
        raised,
        PaymentNotModifiable,
        f"Payment {payment.pk} is {status} and cannot be executed.",
        status=status,
    )
    assert Payment.objects.get(pk=payment.pk).fence == 0


def test_claim_now_leases_the_payment_and_records_when(alice, settings):
    payment = scheduled(alice)
    now = db_now()
    assert transitions.claim_now(payment, now=now, execution_id="op-1") == 1
    stored = Payment.objects.get(pk=payment.pk)
    assert (stored.status, stored.fence, stored.attempts) == ("QUEUED", 1, 1)
    assert stored.lease_expires_at == now + timedelta(seconds=settings.PAYMENT_LEASE_SECONDS)
    assert stored.updated_at == now


# --- dead_letter_put_off ---------------------------------------------------------------


def expired_claim(client, *, lease_ago: timedelta) -> Payment:
    now = db_now()
    return set_status(scheduled(client), "QUEUED", fence=1, lease_expires_at=now - lease_ago)


def test_put_off_moves_the_lease_on_and_says_so(alice):
    payment = expired_claim(alice, lease_ago=timedelta(seconds=5))
    Payment.objects.filter(pk=payment.pk).update(description="changed since it was read")
    now = db_now()
    assert transitions.dead_letter_put_off(payment, now=now, seconds=60) is True
    stored = Payment.objects.get(pk=payment.pk)
    assert (stored.status, stored.fence) == ("QUEUED", 1)
    assert (stored.lease_expires_at, stored.updated_at) == (now + timedelta(seconds=60), now)
    assert stored.description == "changed since it was read"  # only its own fields written
    event = stored.events.get(type="dead_letter_failed")
    assert (event.from_status, event.to_status, event.data) == (
        "QUEUED",
        "QUEUED",
        {"retry_in_seconds": 60},
    )


@pytest.mark.parametrize(
    ("status", "lease_ago"),
    [
        ("PENDING", timedelta(seconds=5)),  # moved on, its lease (stale here) expired
        ("CANCELLED", timedelta(seconds=5)),
        ("QUEUED", timedelta(0)),  # the lease ends at this very instant: not over yet
        ("QUEUED", -timedelta(seconds=30)),  # claimed again meanwhile
    ],
)
def test_put_off_leaves_a_payment_that_moved_on(alice, status, lease_ago):
    payment = expired_claim(alice, lease_ago=lease_ago)
    now = payment.lease_expires_at + lease_ago  # the instant the lease is `lease_ago` past
    payment = set_status(payment, status)
    assert transitions.dead_letter_put_off(payment, now=now, seconds=60) is False
    stored = Payment.objects.get(pk=payment.pk)
    assert stored.lease_expires_at == payment.lease_expires_at
    assert not stored.events.filter(type="dead_letter_failed").exists()


# --- cancel ----------------------------------------------------------------------------


def test_cancel_without_a_reason_records_none(alice):
    payment = scheduled(alice)
    with transaction.atomic():
        transitions.cancel(payment, now=db_now(), actor=Actor.STAFF)
    event = payment.events.get(type="cancelled")
    assert event.data == {}
    assert (event.actor, event.from_status, event.to_status) == ("staff", "PENDING", "CANCELLED")


def test_cancel_with_a_reason_records_it(alice):
    payment = scheduled(alice)
    with transaction.atomic():
        transitions.cancel(payment, now=db_now(), actor=Actor.STAFF, reason="duplicate")
    assert payment.events.get(type="cancelled").data == {"reason": "duplicate"}


@pytest.mark.parametrize("status", ["COMPLETED", "FAILED", "CANCELLED"])
def test_cancel_refuses_a_payment_that_is_no_longer_open(alice, status):
    payment = set_status(scheduled(alice), status)
    with pytest.raises(PaymentNotCancellable) as raised:
        transitions.cancel(payment, now=db_now(), actor=Actor.CLIENT)
    refusal(
        raised,
        PaymentNotCancellable,
        f"Payment {payment.pk} is {status} and can no longer be cancelled.",
        status=status,
    )


# --- reschedule ------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["COMPLETED", "FAILED", "CANCELLED"])
def test_changes_are_refused_once_a_payment_is_no_longer_open(alice, status):
    payment = set_status(scheduled(alice), status)
    for change in (
        lambda: transitions.check_open(payment),
        lambda: transitions.reschedule(payment, due_at=db_now(), actor=Actor.CLIENT),
    ):
        with pytest.raises(PaymentNotModifiable) as raised:
            change()
        refusal(
            raised,
            PaymentNotModifiable,
            f"Payment {payment.pk} is {status} and can no longer be changed.",
            status=status,
        )


def test_rescheduling_a_queued_payment_saves_its_new_time_and_a_full_event(alice):
    """Through the service, as the API does it: the QUEUED payment goes back to
    PENDING with a new fence *and* its new due time is stored."""
    payment = set_status(scheduled(alice), "QUEUED", fence=3, lease_expires_at=db_now())
    old_due = payment.due_at
    updated = services.payment_update(
        payment_id=payment.pk,
        client=alice.user,
        delay_seconds=120,
        actor=Actor.CLIENT,
        actor_user=alice.user,
    )
    stored = Payment.objects.get(pk=payment.pk)
    assert (stored.status, stored.fence, stored.lease_expires_at) == ("PENDING", 4, None)
    assert stored.due_at == stored.run_at == updated.due_at != old_due
    event = stored.events.get(type="rescheduled")
    assert (event.from_status, event.to_status, event.fence) == ("QUEUED", "PENDING", 4)
    assert (event.actor, event.actor_user_id) == ("client", alice.user.pk)
    assert event.data == {"old": iso_timestamp(old_due), "new": iso_timestamp(stored.due_at)}


def test_rescheduling_a_pending_payment_keeps_its_fence(alice):
    payment = scheduled(alice)
    due = db_now() + timedelta(hours=1)
    fields, event = transitions.reschedule(payment, due_at=due, actor=Actor.STAFF)
    assert fields == {"due_at", "run_at"}
    assert (payment.status, payment.fence, payment.due_at, payment.run_at) == (
        "PENDING",
        0,
        due,
        due,
    )
    assert (event.type, event.from_status, event.to_status, event.actor) == (
        "rescheduled",
        "PENDING",
        "PENDING",
        "staff",
    )


# --- retry -----------------------------------------------------------------------------


def dead_letter(client) -> Payment:
    payment = scheduled(client)
    Hold.objects.filter(pk=payment.hold_id).update(status=HoldStatus.RELEASED)
    Account.objects.filter(pk=payment.from_account_id).update(held=0)
    return set_status(
        payment,
        "FAILED",
        error_code=DEAD_LETTER_CODE,
        error_message="Not executed after 5 attempts.",
        attempts=5,
        fence=7,
    )


def test_retry_gives_a_dead_letter_a_fresh_hold_and_a_clean_slate(alice):
    payment = dead_letter(alice)
    old_hold = payment.hold_id
    staff = UserFactory(is_staff=True)
    now = db_now()
    with transaction.atomic():
        transitions.retry(payment, now=now, staff_user=staff)
    stored = Payment.objects.get(pk=payment.pk)
    assert (stored.status, stored.fence, stored.attempts, stored.run_at) == ("PENDING", 8, 0, now)
    assert (stored.error_code, stored.error_message) == ("", "")
    hold = Hold.objects.get(pk=stored.hold_id)
    assert hold.pk != old_hold
    assert (hold.status, hold.amount, hold.reference) == ("active", 100, payment.reference)
    event = stored.events.get(type="retried")
    assert (event.from_status, event.to_status, event.actor, event.actor_user_id, event.fence) == (
        "FAILED",
        "PENDING",
        "staff",
        staff.pk,
        8,
    )


@pytest.mark.parametrize(
    ("status", "code"),
    [("FAILED", "account_not_active"), ("COMPLETED", ""), ("CANCELLED", "")],
)
def test_only_a_dead_letter_can_be_retried(alice, status, code):
    """A business failure is final: it needs a new payment, not a retry."""
    payment = set_status(scheduled(alice), status, error_code=code)
    with pytest.raises(PaymentNotModifiable) as raised:
        transitions.retry(payment, now=db_now(), staff_user=UserFactory(is_staff=True))
    refusal(
        raised,
        PaymentNotModifiable,
        f"Payment {payment.pk} is {status} and is not a dead letter.",
        status=status,
    )
    assert Payment.objects.get(pk=payment.pk).hold_id == payment.hold_id


def test_a_retry_the_funds_no_longer_cover_changes_nothing(alice):
    payment = dead_letter(alice)
    Account.objects.filter(pk=payment.from_account_id).update(held=alice.account.balance)
    with pytest.raises(LedgerError), transaction.atomic():
        transitions.retry(payment, now=db_now(), staff_user=UserFactory(is_staff=True))
    stored = Payment.objects.get(pk=payment.pk)
    assert (stored.status, stored.fence, stored.error_code) == ("FAILED", 7, DEAD_LETTER_CODE)


# --- recurring schedules ---------------------------------------------------------------


def schedule_of(client, **fields) -> RecurringPayment:
    return RecurringPayment.objects.create(
        from_account=client.account,
        to_account=client.other_account,
        amount=5,
        interval_seconds=3600,
        start_time=db_now() + timedelta(minutes=5),
        **fields,
    )


def test_a_schedule_moved_without_a_reason_has_none(alice):
    schedule = schedule_of(alice, status_reason="Paused: earlier trouble.", status="paused")
    transitions.set_schedule_status(schedule, RecurringStatus.ACTIVE)
    assert (schedule.status, schedule.status_reason) == ("active", "")


def test_a_schedule_reason_is_cut_to_the_column(alice):
    schedule = schedule_of(alice)
    transitions.set_schedule_status(schedule, RecurringStatus.PAUSED, reason="r" * 300)
    assert (schedule.status, schedule.status_reason) == ("paused", "r" * 255)


@pytest.mark.parametrize(
    ("current", "target"),
    [
        ("ended", "active"),
        ("cancelled", "paused"),
        ("ended", "cancelled"),
        ("paused", "ended"),
        ("paused", "paused"),
    ],
)
def test_a_schedule_moves_only_along_the_allowed_transitions(alice, current, target):
    schedule = schedule_of(alice, status=current)
    with pytest.raises(RecurringNotChangeable) as raised:
        transitions.set_schedule_status(schedule, target)
    refusal(
        raised,
        RecurringNotChangeable,
        f"Recurring payment {schedule.pk} is {current}; it cannot become {target}.",
        status=current,
    )
    assert schedule.status == current


def test_advancing_a_schedule_with_nothing_left_ends_it(alice):
    schedule = schedule_of(alice, max_occurrences=2, occurrences_run=2)
    transitions.advance_schedule(schedule)
    assert (schedule.status, schedule.next_run_at) == ("ended", None)
    running = schedule_of(alice)
    transitions.advance_schedule(running)
    assert (running.status, running.next_run_at) == ("active", running.start_time)
    paused = schedule_of(alice, status="paused", max_occurrences=1, occurrences_run=1)
    transitions.advance_schedule(paused)
    assert (paused.status, paused.next_run_at) == ("paused", None)  # a paused one stays paused


# --- schedule --------------------------------------------------------------------------


def test_a_scheduled_payment_is_stamped_and_held_under_its_own_id(alice):
    """``schedule_many`` (the bulk loads) and ``schedule`` (the API) make the same
    rows: the hold's reference is ``payment:<the payment's id>``, both stamps are
    the instant given, description and metadata default to empty."""
    now = db_now() - timedelta(minutes=5)  # not the statement's time: the value given
    items = [
        {
            "from_account_id": alice.account.pk,
            "to_account_id": alice.other_account.pk,
            "amount": 7,
            "due_at": now + timedelta(hours=1),
            "now": now,
        }
    ]
    with transaction.atomic():
        (payment,) = transitions.schedule_many(
            LedgerBatch(account_ids=[alice.account.pk]), items, actor=Actor.SYSTEM
        )
    stored = Payment.objects.get(pk=payment.pk)
    assert (stored.created_at, stored.updated_at) == (now, now)
    assert (stored.description, stored.metadata, stored.status, stored.fence) == (
        "",
        {},
        "PENDING",
        0,
    )
    hold = Hold.objects.get(pk=stored.hold_id)
    assert (hold.reference, hold.amount, hold.status) == (f"payment:{stored.pk}", 7, "active")
    event = stored.events.get()
    assert (event.type, event.actor, event.actor_user_id, event.data) == (
        "scheduled",
        "system",
        None,
        {},
    )


def test_a_scheduled_payment_comes_back_as_a_stored_row(alice):
    """``schedule`` writes its rows in statements of its own (``bulk_insert_rows``),
    not ``Model.save``, and hands back the payment as ``save`` would: in the
    database, so a later ``save()`` updates the row (with a default primary key,
    an instance still "adding" would be INSERTed again: a duplicate key)."""
    now = db_now()
    with transaction.atomic():
        payment = transitions.schedule(
            LedgerBatch(account_ids=[alice.account.pk]),
            from_account_id=alice.account.pk,
            to_account_id=alice.other_account.pk,
            amount=7,
            due_at=now + timedelta(hours=1),
            now=now,
            description="rent",
            actor=Actor.CLIENT,
            actor_user=alice.user,
        )
    assert (payment._state.adding, payment._state.db) == (False, "default")
    payment.description = "rent, corrected"
    payment.save()
    stored = Payment.objects.get(pk=payment.pk)
    assert (stored.description, stored.amount, stored.status) == ("rent, corrected", 7, "PENDING")
    assert (stored.created_at, stored.updated_at) == (now, now)
    assert stored.events.get().actor_user_id == alice.user.pk


def test_a_payment_scheduled_through_the_api_records_who_and_how_much(alice):
    payment = scheduled(alice, amount=250)
    event = payment.events.get()
    assert (event.type, event.from_status, event.to_status, event.fence) == (
        "scheduled",
        "",
        "PENDING",
        0,
    )
    assert (event.actor, event.actor_user_id, event.data) == (
        "client",
        alice.user.pk,
        {"amount": 250},
    )
    assert Hold.objects.get(pk=payment.hold_id).reference == f"payment:{payment.pk}"
