"""Recurring payments: API contract, materialiser, missed-run policies, concurrency."""

from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from ledger.models import Account
from payments.clock import iso_timestamp
from payments.engine import executor, materializer
from payments.models import Payment, RecurringBacklog, RecurringOccurrence, RecurringPayment
from tests.payments.helpers import make_schedule
from tests.payments.test_api import error

pytestmark = pytest.mark.django_db


def create(client, omit=(), **overrides):
    """POST a schedule (daily cron by default); fields in ``omit`` are left out,
    e.g. ``omit=["cron"], interval_seconds=60`` for an interval schedule."""
    body = {
        "from_account_id": client.account.pk,
        "to_account_id": client.other_account.pk,
        "amount": 100,
        "cron": "0 9 * * *",
        "timezone": "America/New_York",
    } | overrides
    body = {name: value for name, value in body.items() if name not in omit}
    return client.api.post("/api/v1/recurring-payments", body, format="json")


def test_create_get_list_and_upcoming(alice):
    response = create(
        alice, description="rent", dst_policy={"nonexistent": "skip", "ambiguous": "both"}
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "active" and body["cron"] == "0 9 * * *"
    assert body["dst_policy"] == {"nonexistent": "skip", "ambiguous": "both"}
    assert body["missed_run_policy"] == "skip" and body["max_catch_up"] == 10
    assert len(body["upcoming"]) == 5 and body["next_run_at"] == body["upcoming"][0]
    rid = body["recurring_payment_id"]
    assert alice.api.get(f"/api/v1/recurring-payments/{rid}").json()["recurring_payment_id"] == rid
    listed = alice.api.get("/api/v1/recurring-payments").json()
    assert [r["recurring_payment_id"] for r in listed["recurring_payments"]] == [rid]
    occurrences = alice.api.get(f"/api/v1/recurring-payments/{rid}/occurrences").json()
    assert occurrences["occurrences"] == [] and len(occurrences["upcoming"]) == 5


def test_occurrence_history_pages_newest_first_without_gaps(alice):
    """The occurrence history is paged by id, newest first: five occurrences in
    pages of two are three pages, each occurrence once, the last without a
    cursor; a cursor from another list is refused."""
    rid = create(alice).json()["recurring_payment_id"]
    schedule = RecurringPayment.objects.get(pk=rid)
    start = datetime(2026, 1, 1, 9, tzinfo=UTC)
    made = [
        RecurringOccurrence.objects.create(
            recurring=schedule,
            scheduled_for=start + timedelta(days=day),
            status="skipped",
            reason="missed (skip)",
        ).pk
        for day in range(5)
    ]
    url = f"/api/v1/recurring-payments/{rid}/occurrences"
    seen, cursors, cursor = [], [], None
    while True:
        query = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        body = alice.api.get(url, query).json()
        seen += [o["scheduled_for"] for o in body["occurrences"]]
        cursor = body["next_cursor"]
        cursors.append(cursor)
        if cursor is None:
            break
    newest_first = [
        o.scheduled_for for o in RecurringOccurrence.objects.filter(pk__in=made).order_by("-pk")
    ]
    assert seen == [iso_timestamp(t) for t in newest_first]
    assert len(cursors) == 3 and cursors[-1] is None
    assert alice.api.get(url, {"limit": 2, "cursor": "!!"}).status_code == 400


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * * *"}, "cron"),
        ({"interval_seconds": 3600}, "cron"),  # both
        ({"timezone": "Mars/Base"}, "timezone"),
        # the host's own, not a place's (a review, session 42): two hosts set
        # differently would put one occurrence at two instants
        ({"timezone": "localtime"}, "timezone"),
        ({"timezone": "posixrules"}, "timezone"),
        ({"timezone": "Factory"}, "timezone"),
        ({"timezone": "right/UTC"}, "timezone"),
        ({"timezone": "posix/Europe/Paris"}, "timezone"),
        ({"cron": None}, "cron"),
        ({"amount": 0}, "amount"),
        ({"jitter_seconds": -1}, "jitter_seconds"),
        ({"dst_policy": {"nonexistent": "later"}}, "dst_policy"),
        ({"missed_run_policy": "sometimes"}, "missed_run_policy"),
        ({"end_time": "2020-01-01T00:00:00Z"}, "end_time"),
    ],
)
def test_create_validation(alice, overrides, field):
    err = error(create(alice, **overrides), 400, "validation_error")
    assert field in err["details"]["fields"]
    assert RecurringPayment.objects.count() == 0


def test_interval_only_and_minimum(alice):
    body = {"cron": None}
    error(create(alice, **body, interval_seconds=30), 400, "validation_error")
    response = alice.api.post(
        "/api/v1/recurring-payments",
        {
            "from_account_id": alice.account.pk,
            "to_account_id": alice.other_account.pk,
            "amount": 5,
            "interval_seconds": 3600,
        },
        format="json",
    )
    assert response.status_code == 201 and response.json()["interval_seconds"] == 3600


def test_pause_resume_cancel_and_patch(alice):
    rid = create(alice).json()["recurring_payment_id"]
    base = f"/api/v1/recurring-payments/{rid}"
    assert alice.api.post(f"{base}/pause").json()["status"] == "paused"
    assert alice.api.post(f"{base}/resume").json()["status"] == "active"
    body = alice.api.patch(
        base, {"amount": 250, "missed_run_policy": "run_once"}, format="json"
    ).json()
    assert (body["amount"], body["missed_run_policy"]) == (250, "run_once")
    assert alice.api.post(f"{base}/cancel").json()["status"] == "cancelled"
    err = error(alice.api.post(f"{base}/resume"), 409, "recurring_not_modifiable")
    assert err["details"]["status"] == "cancelled"
    error(alice.api.patch(base, {"amount": 1}, format="json"), 409, "recurring_not_modifiable")


def test_patching_one_dst_key_keeps_the_other(alice):
    """A PATCH changes only the DST keys it sends (the nested serializer's defaults
    used to reset the other one: {"ambiguous": "last"} set nonexistent to shift)."""
    rid = create(alice, dst_policy={"nonexistent": "skip", "ambiguous": "both"}).json()[
        "recurring_payment_id"
    ]
    base = f"/api/v1/recurring-payments/{rid}"
    body = alice.api.patch(base, {"dst_policy": {"ambiguous": "last"}}, format="json").json()
    assert body["dst_policy"] == {"nonexistent": "skip", "ambiguous": "last"}
    body = alice.api.patch(base, {"dst_policy": {"nonexistent": "shift"}}, format="json").json()
    assert body["dst_policy"] == {"nonexistent": "shift", "ambiguous": "last"}
    body = alice.api.patch(base, {"dst_policy": {}}, format="json").json()
    assert body["dst_policy"] == {"nonexistent": "shift", "ambiguous": "last"}
    schedule = RecurringPayment.objects.get(pk=rid)
    assert (schedule.dst_nonexistent, schedule.dst_ambiguous) == ("shift", "last")
    err = error(
        alice.api.patch(base, {"dst_policy": {"ambiguous": "x"}}, format="json"),
        400,
        "validation_error",
    )
    assert "dst_policy" in err["details"]["fields"]


def test_other_clients_schedules_are_not_found(alice, bob):
    rid = create(bob).json()["recurring_payment_id"]
    base = f"/api/v1/recurring-payments/{rid}"
    for method, url, body in (
        ("get", base, None),
        ("patch", base, {"amount": 1}),
        ("post", f"{base}/pause", None),
        ("post", f"{base}/resume", None),
        ("post", f"{base}/cancel", None),
        ("get", f"{base}/occurrences", None),
    ):
        error(getattr(alice.api, method)(url, body, format="json"), 404, "not_found")
    assert RecurringPayment.objects.get(pk=rid).status == "active"
    assert alice.api.get("/api/v1/recurring-payments").json()["recurring_payments"] == []
    error(create(alice, from_account_id=bob.account.pk), 404, "not_found")


def test_create_is_idempotent(alice):
    first = alice.api.post(
        "/api/v1/recurring-payments",
        {
            "from_account_id": alice.account.pk,
            "to_account_id": alice.other_account.pk,
            "amount": 1,
            "cron": "0 * * * *",
        },
        format="json",
        headers={"Idempotency-Key": "sub-1"},
    )
    again = alice.api.post(
        "/api/v1/recurring-payments",
        {
            "from_account_id": alice.account.pk,
            "to_account_id": alice.other_account.pk,
            "amount": 1,
            "cron": "0 * * * *",
        },
        format="json",
        headers={"Idempotency-Key": "sub-1"},
    )
    assert again["Idempotent-Replayed"] == "true" and again.json() == first.json()
    assert RecurringPayment.objects.count() == 1


# --- DST policies through the API ------------------------------------------------


def next_dst_change(zone: str, kind: str, after: date) -> date:
    """The first local date after ``after`` on which ``zone`` springs forward
    (``kind="spring"``) or falls back (``"autumn"``). Both zones used here change
    between 01:00 and 03:00 local, so comparing the offsets at noon finds the day."""
    tz = ZoneInfo(zone)
    day = after + timedelta(days=1)
    for _ in range(400):
        before = datetime.combine(day - timedelta(days=1), time(12), tz).utcoffset()
        now = datetime.combine(day, time(12), tz).utcoffset()
        if (now > before) if kind == "spring" else (now < before):
            return day
        day += timedelta(days=1)
    raise AssertionError(f"no {kind} change in {zone}")  # pragma: no cover


def utc(day: date, hour: int, minute: int) -> datetime:
    return datetime.combine(day, time(hour, minute), UTC)


# (zone, change, daily cron, dst_policy sent (None: the defaults), instants on the
# day of the change in UTC). Berlin: 02:00→03:00 CET→CEST in spring, 02:00-03:00
# twice (CEST 00:xxZ, then CET 01:xxZ) in autumn. New York: 02:00→03:00 EST→EDT in
# spring, 01:00-02:00 twice (EDT 05:xxZ, then EST 06:xxZ) in autumn.
DST_CASES = [
    ("Europe/Berlin", "spring", "30 2 * * *", {"nonexistent": "skip"}, []),
    ("Europe/Berlin", "spring", "30 2 * * *", None, [(1, 0)]),  # shift: 03:00 CEST
    ("Europe/Berlin", "autumn", "30 2 * * *", {"ambiguous": "last"}, [(1, 30)]),
    ("Europe/Berlin", "autumn", "30 2 * * *", {"ambiguous": "both"}, [(0, 30), (1, 30)]),
    ("Europe/Berlin", "autumn", "30 2 * * *", None, [(0, 30)]),  # first
    ("America/New_York", "spring", "30 2 * * *", {"nonexistent": "skip"}, []),
    ("America/New_York", "autumn", "30 1 * * *", {"ambiguous": "last"}, [(6, 30)]),
    ("America/New_York", "autumn", "30 1 * * *", {"ambiguous": "both"}, [(5, 30), (6, 30)]),
]


@pytest.mark.parametrize(("zone", "change", "cron", "policy", "on_the_day"), DST_CASES)
def test_dst_policy_reaches_upcoming_and_materialised_payments(
    alice, settings, zone, change, cron, policy, on_the_day
):
    """A daily schedule created through the API around the zone's next DST change:
    the ``upcoming`` instants it answers and the payments the materialiser creates
    follow the schedule's ``dst_policy`` (not just the calendar functions)."""
    settings.PAYMENT_MAX_DELAY_SECONDS = 2 * 366 * 86400  # the change may be ~a year out
    settings.RECURRING_MATERIALIZE_AHEAD_SECONDS = 2 * 366 * 86400  # materialise all now
    tz = ZoneInfo(zone)
    day = next_dst_change(zone, change, after=timezone.localdate(timezone=tz) + timedelta(days=2))
    hour, minute = (int(f) for f in reversed(cron.split()[:2]))
    start = datetime.combine(day - timedelta(days=2), time(0), tz)
    end = datetime.combine(day + timedelta(days=3), time(0), tz)

    def plain(d):  # an ordinary day: the wall time exists once
        return datetime.combine(d, time(hour, minute), tz).astimezone(UTC)

    expected = [
        plain(day - timedelta(days=2)),
        plain(day - timedelta(days=1)),
        *(utc(day, h, m) for h, m in on_the_day),
        plain(day + timedelta(days=1)),
        plain(day + timedelta(days=2)),
    ]
    extra = {"dst_policy": policy} if policy is not None else {}
    response = create(
        alice,
        cron=cron,
        timezone=zone,
        start_time=start.isoformat(),
        end_time=end.isoformat(),
        **extra,
    )
    assert response.status_code == 201, response.content
    body = response.json()
    parsed = [datetime.fromisoformat(t) for t in body["upcoming"]]
    assert parsed == expected[:5]
    assert datetime.fromisoformat(body["next_run_at"]) == expected[0]

    result = materializer.materialize_due()
    assert (result.scheduled, result.skipped, result.failed) == (len(expected), 0, 0)
    schedule = RecurringPayment.objects.get(pk=body["recurring_payment_id"])
    occurrences = RecurringOccurrence.objects.filter(recurring=schedule).order_by("scheduled_for")
    assert [o.scheduled_for for o in occurrences] == expected
    payments = Payment.objects.filter(recurring=schedule).order_by("due_at")
    assert [p.due_at for p in payments] == expected
    assert Account.objects.get(pk=alice.account.pk).held == 100 * len(expected)
    schedule.refresh_from_db()
    assert schedule.status == "ended" and schedule.next_run_at is None


# --- materialiser ------------------------------------------------------------------


def paused_after_one_run(client, start, **fields):
    """An hourly schedule of ``client`` that ran at ``start`` and was then paused."""
    return make_schedule(
        client.account.pk,
        client.other_account.pk,
        start=start,
        status="paused",
        last_occurrence_at=start,
        next_run_at=start + timedelta(hours=1),
        occurrences_run=1,
        **fields,
    )


def test_resuming_a_schedule_whose_end_passed_while_paused_ends_it(alice):
    """Nothing left to run: it ends (as the materialiser would end it), instead of
    staying active with no next run — never materialised again, yet counted
    against the client's quota of active schedules until cancelled."""
    now = timezone.now()
    start = now - timedelta(hours=5)
    schedule = paused_after_one_run(alice, start, end_time=now - timedelta(hours=1))
    response = alice.api.post(f"/api/v1/recurring-payments/{schedule.pk}/resume")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["status"], body["next_run_at"]) == ("ended", None)
    schedule.refresh_from_db()
    assert (schedule.status, schedule.next_run_at) == ("ended", None)
    again = alice.api.post(f"/api/v1/recurring-payments/{schedule.pk}/resume")
    assert again.status_code == 409, again.content


@pytest.mark.parametrize("policy", ["skip", "run_once", "run_all"])
def test_resume_does_not_run_what_fell_due_while_paused(alice, settings, policy):
    """README: resuming continues from now; occurrences that fell due while the
    schedule was paused do not run, whatever its missed-run policy (that policy
    is for the service being down, not for a client's pause)."""
    now = timezone.now()
    start = now - timedelta(hours=5, minutes=30)
    # ran at `start`, then paused: -4.5h … -0.5h fell due while paused
    schedule = paused_after_one_run(alice, start, missed_run_policy=policy, max_catch_up=10)
    response = alice.api.post(f"/api/v1/recurring-payments/{schedule.pk}/resume")
    assert response.status_code == 200, response.content
    body = response.json()
    following = start + timedelta(hours=6)  # the first occurrence after the resume
    assert body["status"] == "active"
    assert datetime.fromisoformat(body["next_run_at"]) == following
    assert datetime.fromisoformat(body["upcoming"][0]) == following
    materializer.materialize_due()
    assert not Payment.objects.filter(recurring=schedule).exists()
    assert not RecurringOccurrence.objects.filter(recurring=schedule).exclude(status="skipped")
    assert Account.objects.get(pk=alice.account.pk).held == 0
    schedule.refresh_from_db()
    assert (schedule.status, schedule.occurrences_run) == ("active", 1)
    # the schedule goes on from there
    settings.RECURRING_MATERIALIZE_AHEAD_SECONDS = 3600
    assert materializer.materialize_due().scheduled == 1
    (payment,) = Payment.objects.filter(recurring=schedule)
    assert payment.due_at == following


def minutely_catch_up(client, settings, minutes=500, handled=200, **fields):
    """A schedule of ``client`` that has missed ``minutes`` minutely occurrences
    (the service was down) and whose catch-up has handled its first ``handled``."""
    settings.RECURRING_MAX_OCCURRENCES_PER_RUN = 200
    settings.RECURRING_MATERIALIZE_AHEAD_SECONDS = 0
    start = timezone.now() - timedelta(minutes=minutes, seconds=30)
    schedule = make_schedule(
        client.account.pk, client.other_account.pk, start=start, every=60, **fields
    )
    materializer.materialize_one(schedule.pk)
    assert RecurringOccurrence.objects.filter(recurring=schedule).count() == handled
    return schedule, start


def occurrence_rows(schedule):
    return dict(
        RecurringOccurrence.objects.filter(recurring=schedule).values_list(
            "scheduled_for", "reason"
        )
    )


def test_pausing_a_catch_up_records_the_missed_occurrences_it_had_not_reached(alice, settings):
    """DESIGN §4.2: each missed occurrence is recorded. A pause during a catch-up
    (200 instants a run) and a resume, which starts again from now, left the
    300 missed minutes not yet reached without a trace; they are recorded
    ``skipped`` (``paused``), none of them runs, and the paused gap itself is
    not recorded (it did not run because the client paused, as before)."""
    schedule, start = minutely_catch_up(alice, settings)
    base = f"/api/v1/recurring-payments/{schedule.pk}"
    assert alice.api.post(f"{base}/pause").status_code == 200
    assert alice.api.post(f"{base}/resume").status_code == 200
    for _ in range(5):
        materializer.materialize_due()
    rows = occurrence_rows(schedule)
    missed = [start + timedelta(minutes=k) for k in range(501)]  # the 501st was 30 s ago
    assert set(missed) <= set(rows)
    assert [rows[t] for t in missed[:200]] == ["missed (skip)"] * 200
    assert {rows[t] for t in missed[200:]} == {"paused"}
    assert len(rows) == 501  # nothing past the pause
    assert not Payment.objects.filter(recurring=schedule).exists()
    assert not RecurringBacklog.objects.exists()


def test_a_schedule_whose_time_zone_is_gone_can_still_be_paused(alice):
    """Pausing recomputes next_run_at, which reads the calendar: with a time zone
    tzdata no longer has it raised InvalidSchedule, a 500 (a reviewer's finding
    on this session's change). The old next_run_at stays."""
    later = timezone.now() + timedelta(hours=1)
    schedule = make_schedule(
        alice.account.pk,
        alice.other_account.pk,
        start=later,
        last_occurrence_at=timezone.now() + timedelta(minutes=30),
    )
    RecurringPayment.objects.filter(pk=schedule.pk).update(
        cron="0 9 * * *", interval_seconds=None, timezone="Mars/Base"
    )
    response = alice.api.post(f"/api/v1/recurring-payments/{schedule.pk}/pause")
    assert response.status_code == 200, response.content
    schedule.refresh_from_db()
    assert (schedule.status, schedule.next_run_at) == ("paused", later)


def test_the_backlog_is_recorded_a_bounded_number_per_run_even_while_paused(alice, settings):
    """However long the catch-up that a pause cut short, the pause itself is O(1)
    and the materialiser records the rest 200 a run, paused or not."""
    schedule, _ = minutely_catch_up(alice, settings)
    assert alice.api.post(f"/api/v1/recurring-payments/{schedule.pk}/pause").status_code == 200
    assert RecurringOccurrence.objects.filter(recurring=schedule).count() == 200
    assert materializer.materialize_due().skipped == 200
    assert RecurringOccurrence.objects.filter(recurring=schedule).count() == 400
    assert materializer.materialize_due().skipped == 101
    assert materializer.materialize_due().skipped == 0
    assert len(occurrence_rows(schedule)) == 501
    schedule.refresh_from_db()
    assert schedule.status == "paused"


def test_cancelling_a_catch_up_records_what_it_had_not_reached_but_not_a_paused_gap(
    alice, settings
):
    schedule, _ = minutely_catch_up(alice, settings, minutes=300)
    assert alice.api.post(f"/api/v1/recurring-payments/{schedule.pk}/cancel").status_code == 200
    materializer.materialize_due()
    rows = occurrence_rows(schedule)
    assert len(rows) == 301 and list(rows.values()).count("cancelled") == 101
    # paused (its cursor moves to the pause), then cancelled: nothing more to record
    other, _ = minutely_catch_up(alice, settings, minutes=250)
    for action in ("pause", "cancel"):
        assert alice.api.post(f"/api/v1/recurring-payments/{other.pk}/{action}").status_code == 200
    assert RecurringBacklog.objects.filter(recurring=other).count() == 1
    materializer.materialize_due()
    assert list(occurrence_rows(other).values()).count("paused") == 51
    assert list(occurrence_rows(other).values()).count("cancelled") == 0


def test_a_schedule_paused_by_its_failures_mid_catch_up_records_the_rest(alice, settings):
    """The materialiser's own pause (too many consecutive failed occurrences)
    cuts a catch-up short like the client's: the rest is recorded, not lost
    to the resume."""
    Account.objects.filter(pk=alice.account.pk).update(max_payment_amount=5)
    schedule, _ = minutely_catch_up(
        alice,
        settings,
        minutes=30,
        missed_run_policy="run_all",
        max_catch_up=20,
        max_consecutive_failures=2,
        amount=10,
        handled=12,
    )
    schedule.refresh_from_db()
    assert schedule.status == "paused"  # by its second failure: 10 skipped + 2 failed
    materializer.materialize_due()
    rows = occurrence_rows(schedule)
    assert len(rows) == 31
    assert list(rows.values()).count("amount_over_limit") == 2
    assert list(rows.values()).count("paused") == 31 - 10 - 2
    assert alice.api.post(f"/api/v1/recurring-payments/{schedule.pk}/resume").status_code == 200
    materializer.materialize_due()
    assert len(occurrence_rows(schedule)) == 31


def test_run_all_with_fewer_occurrences_left_runs_the_latest_and_records_the_rest(alice, settings):
    """max_occurrences 3 and 10 kept missed: the oldest 3 of the kept ran, the
    schedule ended, and the other 7 were never recorded. Now the latest 3 run
    and the 7 before them are recorded skipped, as README's table says."""
    settings.RECURRING_MATERIALIZE_AHEAD_SECONDS = 0
    start = timezone.now() - timedelta(minutes=10, seconds=30)
    schedule = make_schedule(
        alice.account.pk,
        alice.other_account.pk,
        start=start,
        every=60,
        missed_run_policy="run_all",
        max_catch_up=10,
        max_occurrences=3,
    )
    materializer.materialize_due()
    rows = dict(
        RecurringOccurrence.objects.filter(recurring=schedule).values_list(
            "scheduled_for", "status"
        )
    )
    missed = [start + timedelta(minutes=k) for k in range(10)]
    assert [rows.get(t) for t in missed] == ["skipped"] * 7 + ["scheduled"] * 3
    assert len(rows) == 10  # the 11th, on time, is past max_occurrences
    schedule.refresh_from_db()
    assert (schedule.status, schedule.occurrences_run) == ("ended", 3)


@pytest.mark.parametrize(("policy", "skipped", "caught_up"), [("skip", 3, 0), ("run_once", 2, 1)])
def test_max_occurrences_does_not_count_skipped_occurrences(
    alice, settings, policy, skipped, caught_up
):
    """README: ``max_occurrences`` counts occurrences that ran or failed, not
    skipped ones. Two allowed, three missed during downtime: the skipped ones
    leave the schedule both of its runs."""
    now = timezone.now()
    start = now - timedelta(hours=2, minutes=30)  # -2.5h, -1.5h, -0.5h missed
    schedule = make_schedule(
        alice.account.pk,
        alice.other_account.pk,
        start=start,
        missed_run_policy=policy,
        max_occurrences=2,
    )
    result = materializer.materialize_due()
    assert (result.skipped, result.scheduled) == (skipped, caught_up)
    schedule.refresh_from_db()
    assert (schedule.status, schedule.occurrences_run) == ("active", caught_up)
    rest = [start + timedelta(hours=k) for k in range(3, 3 + 2 - caught_up)]
    body = alice.api.get(f"/api/v1/recurring-payments/{schedule.pk}").json()
    assert [datetime.fromisoformat(t) for t in body["upcoming"]] == rest
    settings.RECURRING_MATERIALIZE_AHEAD_SECONDS = 4 * 3600  # -> start + 6.5h
    assert materializer.materialize_due().scheduled == 2 - caught_up
    schedule.refresh_from_db()
    assert (schedule.status, schedule.occurrences_run) == ("ended", 2)
    ran = RecurringOccurrence.objects.filter(recurring=schedule, status="scheduled")
    assert sorted(o.scheduled_for for o in ran)[caught_up:] == rest
    assert Payment.objects.filter(recurring=schedule).count() == 2
    assert RecurringOccurrence.objects.filter(recurring=schedule, status="skipped").count() == (
        skipped
    )


def test_cancelling_a_schedule_cancels_its_materialised_occurrence(alice):
    """No money leaves on a cancelled schedule's behalf: the occurrence already
    created (within the materialise-ahead window) is cancelled, its hold released."""
    schedule = make_schedule(
        alice.account.pk,
        alice.other_account.pk,
        start=timezone.now() + timedelta(seconds=30),
        amount=100,
    )
    rid = schedule.pk
    assert materializer.materialize_due().scheduled == 1
    (payment,) = Payment.objects.filter(recurring_id=rid)
    assert payment.status == "PENDING" and Account.objects.get(pk=alice.account.pk).held == 100
    response = alice.api.post(f"/api/v1/recurring-payments/{rid}/cancel")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    payment.refresh_from_db()
    assert payment.status == "CANCELLED"
    assert payment.events.filter(type="cancelled", actor="client").exists()
    assert Account.objects.get(pk=alice.account.pk).held == 0
    assert materializer.materialize_due().scheduled == 0


def test_an_occurrence_says_what_became_of_its_payment(alice, monkeypatch):
    """scheduled → completed, failed or cancelled as its payment moves on (not 'scheduled'
    forever); an unfunded occurrence stays failed and a missed one skipped."""
    from ledger.services import account_set_status
    from payments.engine import materializer
    from tests.payments.helpers import make_due, sweep

    now = timezone.now()
    schedules = [
        make_schedule(
            alice.account.pk,
            alice.other_account.pk,
            start=now + timedelta(seconds=30 + k),
            amount=10,
        )
        for k in range(3)
    ]
    assert materializer.materialize_due().scheduled == 3
    completed, failed, cancelled = (Payment.objects.get(recurring=s) for s in schedules)

    def outcome(schedule):
        rid = schedule.pk
        body = alice.api.get(f"/api/v1/recurring-payments/{rid}/occurrences").json()
        (occurrence,) = body["occurrences"]
        return occurrence["status"], occurrence["payment_status"]

    assert [outcome(s) for s in schedules] == [("scheduled", "PENDING")] * 3
    alice.api.post(f"/api/v1/payments/{cancelled.pk}/cancel")
    make_due(completed.pk, failed.pk)
    _, published = sweep(monkeypatch)
    claims = [item for item in published.items() if item[0] == str(completed.pk)]
    executor.execute_chunk(claims)
    account_set_status(account_id=alice.other_account.pk, status="frozen")
    executor.execute_chunk([item for item in published.items() if item[0] == str(failed.pk)])
    assert [outcome(s) for s in schedules] == [
        ("completed", "COMPLETED"),
        ("failed", "FAILED"),
        ("cancelled", "CANCELLED"),
    ]


# --- a reviewer's findings: ending, limits and parked schedules ------------------------


def one_materialised(client, **fields):
    """An hourly schedule that ran once an hour ago; its next occurrence (in 30 s)
    is already materialised: a PENDING payment with its hold."""
    now = timezone.now()
    start = now - timedelta(hours=1) + timedelta(seconds=30)
    schedule = make_schedule(
        client.account.pk,
        client.other_account.pk,
        start=start,
        amount=100,
        last_occurrence_at=start,
        next_run_at=start + timedelta(hours=1),
        occurrences_run=1,
        **fields,
    )
    assert materializer.materialize_due().scheduled == 1
    (payment,) = Payment.objects.filter(recurring=schedule)
    assert payment.status == "PENDING"
    return schedule, payment, start + timedelta(hours=1)


def test_moving_end_time_before_a_materialised_occurrence_cancels_its_payment(alice):
    """The schedule answered `ended` while the occurrence past its new end stayed
    PENDING with its hold, and would have paid."""
    schedule, payment, occurrence_at = one_materialised(alice)
    held = Account.objects.get(pk=alice.account.pk).held
    new_end = occurrence_at - timedelta(seconds=20)
    response = alice.api.patch(
        f"/api/v1/recurring-payments/{schedule.pk}",
        {"end_time": new_end.isoformat()},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "ended"
    payment.refresh_from_db()
    assert payment.status == "CANCELLED"
    assert Account.objects.get(pk=alice.account.pk).held == held - 100
    event = payment.events.order_by("pk").last()
    assert event.type == "cancelled" and "end_time" in event.data["reason"]


def test_an_end_time_after_the_materialised_occurrence_leaves_it(alice):
    schedule, payment, occurrence_at = one_materialised(alice)
    response = alice.api.patch(
        f"/api/v1/recurring-payments/{schedule.pk}",
        {"end_time": (occurrence_at + timedelta(minutes=5)).isoformat()},
        format="json",
    )
    assert response.status_code == 200, response.content
    payment.refresh_from_db()
    assert payment.status == "PENDING"


def test_max_occurrences_cannot_go_below_what_ran_or_is_scheduled(alice):
    schedule, payment, _ = one_materialised(alice)
    response = alice.api.patch(
        f"/api/v1/recurring-payments/{schedule.pk}", {"max_occurrences": 1}, format="json"
    )
    body = error(response, 400, "validation_error")
    assert "max_occurrences" in body["details"]["fields"]
    schedule.refresh_from_db()
    assert (schedule.status, schedule.max_occurrences) == ("active", None)
    payment.refresh_from_db()
    assert payment.status == "PENDING"
    ok = alice.api.patch(
        f"/api/v1/recurring-payments/{schedule.pk}", {"max_occurrences": 2}, format="json"
    )
    assert ok.status_code == 200 and ok.json()["status"] == "ended"  # both counted
    payment.refresh_from_db()
    assert payment.status == "PENDING"  # within the limit: it runs


def test_a_lowered_max_payment_amount_applies_to_the_next_occurrences(alice):
    """Checked at create and PATCH only, a limit staff lowered afterwards never
    applied to a schedule: each occurrence paid over it."""
    schedule = make_schedule(
        alice.account.pk,
        alice.other_account.pk,
        start=timezone.now() + timedelta(seconds=30),
        amount=500,
    )
    Account.objects.filter(pk=alice.account.pk).update(max_payment_amount=100)
    assert materializer.materialize_due().failed == 1
    assert not Payment.objects.filter(recurring=schedule).exists()
    occurrence = RecurringOccurrence.objects.get(recurring=schedule)
    assert (occurrence.status, occurrence.reason) == ("failed", "amount_over_limit")
    assert Account.objects.get(pk=alice.account.pk).held == 0


def test_the_last_occurrence_failing_ends_the_schedule_not_pauses_it(settings):
    """Paused, it waited for a resume that could only end it, and took a slot of the
    client's quota meanwhile."""
    from tests.factories import AccountFactory, UserFactory

    settings.RECURRING_MATERIALIZE_AHEAD_SECONDS = 0
    owner = UserFactory()
    source = AccountFactory(owner=owner, funded=0).pk
    target = AccountFactory(owner=owner).pk
    start = timezone.now() - timedelta(seconds=70)  # -70 s (missed), -10 s

    def failing(max_occurrences):
        schedule = make_schedule(
            source,
            target,
            start=start,
            every=60,
            missed_run_policy="run_all",
            max_occurrences=max_occurrences,
            max_consecutive_failures=2,
        )
        materializer.materialize_one(schedule.pk)
        schedule.refresh_from_db()
        return schedule

    schedule = failing(max_occurrences=2)
    assert RecurringOccurrence.objects.filter(recurring=schedule, status="failed").count() == 2
    assert (schedule.status, schedule.occurrences_run, schedule.next_run_at) == ("ended", 2, None)
    # with an occurrence left, the same failures still pause it
    assert failing(max_occurrences=3).status == "paused"


def test_resuming_a_schedule_parked_for_a_zone_no_longer_known_is_a_409(alice):
    """tzdata drops zones (US/Pacific-New, 2020b): the materialiser parks such a
    schedule; its resume raised InvalidSchedule, a 500."""
    schedule = make_schedule(
        alice.account.pk, alice.other_account.pk, start=timezone.now() + timedelta(seconds=30)
    )
    RecurringPayment.objects.filter(pk=schedule.pk).update(
        cron="0 9 * * *", interval_seconds=None, timezone="US/Pacific-New"
    )
    assert materializer.materialize_due().paused_on_error == 1
    response = alice.api.post(f"/api/v1/recurring-payments/{schedule.pk}/resume")
    body = error(response, 409, "recurring_not_modifiable")
    assert "cancel it" in body["message"]
    schedule.refresh_from_db()
    assert schedule.status == "paused"
    assert alice.api.post(f"/api/v1/recurring-payments/{schedule.pk}/cancel").status_code == 200
