"""Calendar policies of recurring schedules (pure functions, no database)."""

import itertools
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from payments.calendar import InvalidSchedule, Spec, jitter_for, upcoming, validate_cron, zone

NY = "America/New_York"


def utc(*args):
    return datetime(*args, tzinfo=UTC)


def local_strings(instants, tz):
    return [i.astimezone(zone(tz)).strftime("%Y-%m-%d %H:%M %Z") for i in instants]


JAN_1 = utc(2026, 1, 1)


def spec(cron, tz=NY, start=JAN_1, **policy):
    return Spec(cron=cron, interval_seconds=None, timezone=tz, start_time=start, **policy)


def test_spring_forward_shift_runs_at_first_valid_time_after_the_gap():
    s = spec("30 2 * * *", nonexistent="shift")
    runs = upcoming(s, after=utc(2026, 3, 7, 12), count=3)
    assert local_strings(runs, NY) == [
        "2026-03-08 03:00 EDT",  # 02:30 does not exist on 8 March
        "2026-03-09 02:30 EDT",
        "2026-03-10 02:30 EDT",
    ]
    assert runs[0] == utc(2026, 3, 8, 7, 0)


def test_spring_forward_skip_drops_the_day():
    s = spec("30 2 * * *", nonexistent="skip")
    runs = upcoming(s, after=utc(2026, 3, 7, 12), count=2)
    assert local_strings(runs, NY) == ["2026-03-09 02:30 EDT", "2026-03-10 02:30 EDT"]


@pytest.mark.parametrize(
    ("ambiguous", "expected"),
    [
        ("first", ["2026-11-01 01:30 EDT", "2026-11-02 01:30 EST"]),
        ("last", ["2026-11-01 01:30 EST", "2026-11-02 01:30 EST"]),
        ("both", ["2026-11-01 01:30 EDT", "2026-11-01 01:30 EST", "2026-11-02 01:30 EST"]),
    ],
)
def test_fall_back_repeated_time(ambiguous, expected):
    s = spec("30 1 * * *", ambiguous=ambiguous)
    runs = upcoming(s, after=utc(2026, 10, 31, 12), count=len(expected))
    assert local_strings(runs, NY) == expected


def test_fall_back_both_runs_every_wall_time_of_the_repeated_hour_twice_in_order():
    """Every quarter of 01:xx twice: EDT's four, then EST's four (a reviewer found
    EDT's 01:15-01:45 dropped: each came after EST's 01:00 was already given)."""
    s = spec("*/15 1 * * *", ambiguous="both")
    runs = upcoming(s, after=utc(2026, 10, 31, 12), count=9)
    assert local_strings(runs, NY) == [
        *(f"2026-11-01 01:{m:02d} EDT" for m in (0, 15, 30, 45)),
        *(f"2026-11-01 01:{m:02d} EST" for m in (0, 15, 30, 45)),
        "2026-11-02 01:00 EST",
    ]
    # resumed between the two halves, and with an end inside the second
    assert upcoming(s, after=utc(2026, 11, 1, 5, 45), count=1) == [utc(2026, 11, 1, 6)]
    ended = spec("*/15 1 * * *", ambiguous="both", end_time=utc(2026, 11, 1, 6, 15))
    assert local_strings(upcoming(ended, after=utc(2026, 10, 31, 12), count=9), NY) == [
        *(f"2026-11-01 01:{m:02d} EDT" for m in (0, 15, 30, 45)),
        "2026-11-01 01:00 EST",
        "2026-11-01 01:15 EST",
    ]


def test_fall_back_both_resumes_correctly_between_the_two_instants():
    s = spec("30 1 * * *", ambiguous="both")
    first = utc(2026, 11, 1, 5, 30)  # 01:30 EDT
    assert upcoming(s, after=first, count=1) == [utc(2026, 11, 1, 6, 30)]  # 01:30 EST


def test_europe_london_daily_at_0130():
    s = spec("30 1 * * *", tz="Europe/London", start=utc(2026, 3, 1), nonexistent="shift")
    runs = upcoming(s, after=utc(2026, 3, 28, 12), count=2)
    # 29 March 2026: clocks go 01:00 GMT -> 02:00 BST, 01:30 does not exist
    assert local_strings(runs, "Europe/London") == ["2026-03-29 02:00 BST", "2026-03-30 01:30 BST"]
    s = spec("30 1 * * *", tz="Europe/London", start=utc(2026, 3, 1), ambiguous="last")
    runs = upcoming(s, after=utc(2026, 10, 24, 12), count=1)
    # 25 October 2026: 01:30 happens in BST then GMT
    assert local_strings(runs, "Europe/London") == ["2026-10-25 01:30 GMT"]


@pytest.mark.parametrize(("year", "day"), [(2028, 29), (2027, 28)])
def test_last_day_of_february_leap_and_non_leap(year, day):
    s = spec("0 9 L * *", tz="UTC", start=utc(year, 1, 1))
    runs = upcoming(s, after=utc(year, 1, 31, 12), count=2)
    assert runs == [utc(year, 2, day, 9), utc(year, 3, 31, 9)]


def test_monthly_on_the_31st_only_runs_in_months_that_have_one():
    s = spec("0 12 31 * *", tz="UTC", start=utc(2026, 1, 1))
    runs = upcoming(s, after=utc(2026, 1, 1), count=4)
    assert [r.month for r in runs] == [1, 3, 5, 7]


def test_interval_schedule_and_end_time():
    s = Spec(
        cron=None,
        interval_seconds=3600,
        timezone="UTC",
        start_time=utc(2026, 1, 1),
        end_time=utc(2026, 1, 1, 2),
    )
    assert upcoming(s, after=None, count=10) == [
        utc(2026, 1, 1, 0),
        utc(2026, 1, 1, 1),
        utc(2026, 1, 1, 2),
    ]
    assert upcoming(s, after=utc(2026, 1, 1, 0, 30), count=10) == [
        utc(2026, 1, 1, 1),
        utc(2026, 1, 1, 2),
    ]


def test_cron_starts_at_start_time_inclusive():
    s = spec("0 9 * * *", tz="UTC", start=utc(2026, 5, 1, 9))
    assert upcoming(s, after=None, count=1) == [utc(2026, 5, 1, 9)]


def test_no_occurrence_before_a_start_time_with_microseconds():
    """The API keeps a start time's microseconds: a cron match one microsecond
    before it is before the start, so the first run is the next day's."""
    s = spec("0 9 * * *", tz="UTC", start=utc(2026, 5, 1, 9, 0, 0, 1))
    assert upcoming(s, after=None, count=1) == [utc(2026, 5, 2, 9)]


FIELDS = "A cron expression has 5 fields: minute hour day month weekday."


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("* * * *", FIELDS),
        ("0 9 * * * *", FIELDS),
        ("nonsense", FIELDS),
        ("61 * * * *", "Invalid cron expression '61 * * * *'."),
        ("0 9 * 13 *", "Invalid cron expression '0 9 * 13 *'."),
    ],
)
def test_invalid_cron(expr, message):
    """The message is what the API answers in ``details.fields.cron``."""
    with pytest.raises(InvalidSchedule) as raised:
        validate_cron(expr)
    assert str(raised.value) == message


def test_unknown_zone():
    with pytest.raises(InvalidSchedule) as raised:
        zone("Mars/Olympus_Mons")
    assert str(raised.value) == "Unknown time zone 'Mars/Olympus_Mons'."


@pytest.mark.parametrize("expr", ["R R * * *", "0 R * * *", "H 9 * * *", "0 9 * * r"])
def test_random_and_hashed_cron_fields_are_refused(expr):
    """croniter reads R as a value drawn again at every evaluation and H as a hash:
    a schedule's times must not change between two reads (a reviewer's finding:
    "R R * * *" was accepted and every GET showed other times)."""
    with pytest.raises(InvalidSchedule) as raised:
        validate_cron(expr)
    assert str(raised.value) == f"Invalid cron expression {expr!r}."


@pytest.mark.parametrize(
    "expr", ["0 9 L * mon-fri", "0 0 1 jan,jul *", "30 8 * * SUN", "0 0 15W * *", "0 12 * DEC sat"]
)
def test_last_day_weekday_and_names_are_accepted(expr):
    assert validate_cron(expr) == expr


@pytest.mark.parametrize("name", ["America", "Etc", "posix", "right", "", ".", "../etc"])
def test_a_folder_or_path_is_not_a_time_zone(name):
    with pytest.raises(InvalidSchedule):
        zone(name)


# Pieces of fields croniter reads (and some it must not be given), joined in fives,
# and any text at all.
CRON_FIELD = st.sampled_from(
    [
        "*",
        "0",
        "5",
        "*/15",
        "1-5",
        "5-1",
        "1,2",
        "L",
        "W",
        "15W",
        "5#2",
        "?",
        "R",
        "H",
        "mon-fri",
        "jan",
        "sun",
        "²",
        "1-0",
        "0/0",
        "*/0",
        "60",
        "13",
        "x",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    fields=st.lists(CRON_FIELD, min_size=5, max_size=5).map(" ".join)
    | st.lists(st.text(min_size=1, max_size=4), min_size=5, max_size=5).map(" ".join)
    | st.text(),
    tz=st.text() | st.sampled_from(["America", "Etc/GMT+5", "UTC", NY, "posix/UTC", "Factory"]),
)
def test_any_cron_and_zone_text_is_a_calendar_or_a_clear_refusal(fields, tz):
    """Property: what a client sends as ``cron`` and ``timezone`` is refused with
    InvalidSchedule (the API's 400) or gives a calendar that reads the same every
    time — never another exception (the kind of test that was missing for
    "America", a 500, and for "R R * * *", a different schedule at every read)."""
    try:
        expr = validate_cron(fields)
        zone(tz)
    except InvalidSchedule:
        return
    s = spec(expr, tz=tz)
    after = utc(2026, 6, 1)
    assert upcoming(s, after=after, count=3) == upcoming(s, after=after, count=3)


def test_cron_end_time_is_inclusive():
    s = spec("0 9 * * *", tz="UTC", start=utc(2026, 5, 1), end_time=utc(2026, 5, 3, 9))
    assert upcoming(s, after=None, count=10) == [
        utc(2026, 5, 1, 9),
        utc(2026, 5, 2, 9),
        utc(2026, 5, 3, 9),
    ]


def test_a_gap_shifts_every_minute_to_the_first_valid_minute():
    for minute in (1, 31, 59):
        s = spec(f"{minute} 2 * * *", nonexistent="shift")
        runs = upcoming(s, after=utc(2026, 3, 7, 12), count=1)
        assert local_strings(runs, NY) == ["2026-03-08 03:00 EDT"]


def test_resuming_a_minute_before_the_clocks_go_back_finds_the_repeated_hour():
    """At 01:59:59 EDT the wall clock is about to show 01:00 again (EST): a
    daily 01:00 with ``last`` runs an hour later, not the next day."""
    s = spec("0 1 * * *", ambiguous="last")
    after = utc(2026, 11, 1, 5, 59, 59)  # 01:59:59 EDT
    assert local_strings(upcoming(s, after=after, count=1), NY) == ["2026-11-01 01:00 EST"]


def test_fall_back_from_utc_offset_zero():
    """Atlantic/Azores falls back from UTC+0 to UTC-1 (25 October 2026, 01:00 ->
    00:00): 00:30 happens twice, the second time at 01:30 UTC."""
    s = spec("30 0 * * *", tz="Atlantic/Azores", ambiguous="last")
    after = utc(2026, 10, 25, 0, 59)  # 00:59 local, UTC+0, a minute before the change
    assert upcoming(s, after=after, count=1) == [utc(2026, 10, 25, 1, 30)]


@pytest.mark.parametrize(
    ("tz", "expected_hours"),
    [("UTC", [19, 20, 21, 22, 23]), ("Asia/Tokyo", [10, 11, 12, 13, 14])],
)
def test_the_calendar_runs_to_the_last_representable_instant(tz, expected_hours):
    """Hourly up to 9999-12-31: every instant up to datetime.max, none dropped in
    the last hours (a reviewer's finding: the DST margin overflowed there and
    ended the calendar three hours early)."""
    s = spec("0 * * * *", tz=tz, start=utc(9999, 12, 30))
    after = utc(9999, 12, 31, expected_hours[0] - 1, 30)
    runs = upcoming(s, after=after, count=10)
    assert runs == [utc(9999, 12, 31, h) for h in expected_hours]


def test_resuming_far_from_the_start_is_as_cheap_as_near_it():
    """An interval schedule jumps to the first instant after ``after``; walking
    there from ``start_time`` would take billions of steps."""
    s = Spec(cron=None, interval_seconds=60, timezone="UTC", start_time=utc(1, 1, 1, 0, 0))
    assert upcoming(s, after=utc(9000, 1, 1, 0, 0, 30), count=2) == [
        utc(9000, 1, 1, 0, 1),
        utc(9000, 1, 1, 0, 2),
    ]


CRONS = ["*/30 * * * *", "0 * * * *", "30 2 * * *", "30 1 * * *", "*/15 1 * * *", "0 0 L * *"]


def brute_force(s, after, days):
    """The occurrences after ``after`` by the definition: every wall time croniter
    gives from a day before, each resolved under the policies, sorted, unique."""
    from croniter import croniter

    from payments.calendar import resolve_local

    tz = zone(s.timezone)
    it = croniter(s.cron, (after - timedelta(days=1)).astimezone(tz).replace(tzinfo=None))
    found = set()
    while (local := it.get_next(datetime)) < after.astimezone(tz).replace(tzinfo=None) + days:
        found.update(resolve_local(local, tz, nonexistent=s.nonexistent, ambiguous=s.ambiguous))
    return sorted(i for i in found if i > after and (s.end_time is None or i <= s.end_time))


# Each zone's 2026 clock changes (the day; the brute force covers the days around it).
CHANGES = [
    (NY, (3, 8)),
    (NY, (11, 1)),
    ("Europe/London", (3, 29)),
    ("Europe/London", (10, 25)),
    ("Atlantic/Azores", (3, 29)),
    ("Atlantic/Azores", (10, 25)),
    ("Australia/Lord_Howe", (4, 5)),  # half an hour back
    ("Australia/Lord_Howe", (10, 4)),  # half an hour forward
]


@given(
    cron=st.sampled_from(CRONS),
    change=st.sampled_from(CHANGES),
    nonexistent=st.sampled_from(["shift", "skip"]),
    ambiguous=st.sampled_from(["first", "last", "both"]),
    offset_minutes=st.integers(min_value=0, max_value=2 * 24 * 60),
)
def test_occurrences_are_every_resolved_wall_time_in_order(
    cron, change, nonexistent, ambiguous, offset_minutes
):
    """The calendar against its definition (brute force) across DST changes: none
    dropped, none added, none out of order — the missing kind of test for the
    dropped ``both`` occurrences, which the ordering property alone did not catch."""
    tz, when = change
    s = spec(cron, tz=tz, nonexistent=nonexistent, ambiguous=ambiguous)
    after = utc(2026, *when) - timedelta(days=1) + timedelta(minutes=offset_minutes)
    horizon = after + timedelta(days=2)  # the brute force looks 3 days of wall time ahead
    expected = [i for i in brute_force(s, after, timedelta(days=3)) if i <= horizon]
    got = upcoming(s, after=after, count=len(expected) + 1)
    assert [i for i in got if i <= horizon] == expected


@pytest.mark.parametrize(("tz", "when"), CHANGES)
@pytest.mark.parametrize("cron", ["*/15 1 * * *", "*/30 * * * *", "30 2 * * *"])
@pytest.mark.parametrize("ambiguous", ["first", "last", "both"])
@pytest.mark.parametrize("nonexistent", ["shift", "skip"])
def test_every_clock_change_of_2026_against_the_definition(tz, when, cron, ambiguous, nonexistent):
    """The brute-force comparison, deterministic: every zone's changes, policies and
    a cron with several times in the changed hour (the property test above draws
    from the same space at random)."""
    s = spec(cron, tz=tz, nonexistent=nonexistent, ambiguous=ambiguous)
    after = utc(2026, *when) - timedelta(days=1)
    horizon = after + timedelta(days=2)
    expected = [i for i in brute_force(s, after, timedelta(days=3)) if i <= horizon]
    got = upcoming(s, after=after, count=len(expected) + 1)
    assert [i for i in got if i <= horizon] == expected


@given(
    cron=st.sampled_from(CRONS),
    tz=st.sampled_from([NY, "Europe/London", "Australia/Lord_Howe", "UTC"]),
    nonexistent=st.sampled_from(["shift", "skip"]),
    ambiguous=st.sampled_from(["first", "last", "both"]),
    offset_hours=st.integers(min_value=0, max_value=24 * 400),
)
def test_occurrences_are_strictly_increasing_and_resumable(
    cron, tz, nonexistent, ambiguous, offset_hours
):
    s = spec(cron, tz=tz, nonexistent=nonexistent, ambiguous=ambiguous)
    after = utc(2026, 1, 1) + timedelta(hours=offset_hours)
    runs = upcoming(s, after=after, count=6)
    assert all(a < b for a, b in itertools.pairwise(runs))
    assert all(r > after for r in runs)
    # resuming from any occurrence gives the same continuation
    for i in range(len(runs) - 1):
        assert upcoming(s, after=runs[i], count=1) == [runs[i + 1]]


def test_jitter_spreads_occurrences_over_the_window_in_milliseconds():
    """``jitter_for``: 0 without jitter; otherwise a deterministic delay in
    [0, jitter_seconds], whole milliseconds, spread over the window (over 300
    instants both halves are used). A known answer pins it across versions:
    every node and every retry must agree on an occurrence's delay."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    schedule = SimpleNamespace(pk=uuid.UUID(int=1), jitter_seconds=600)
    delays = [jitter_for(schedule, start + timedelta(hours=h)).total_seconds() for h in range(300)]
    assert all(0 <= d <= 600 for d in delays)
    assert all(abs(d * 1000 - round(d * 1000)) < 1e-6 for d in delays)  # whole milliseconds
    assert any(d != int(d) for d in delays)  # and not whole seconds
    assert min(delays) < 150 and max(delays) > 450
    assert jitter_for(schedule, start) == jitter_for(schedule, start)
    assert jitter_for(schedule, start).total_seconds() == 269.656
    assert jitter_for(SimpleNamespace(pk=schedule.pk, jitter_seconds=0), start) == timedelta(0)


@pytest.mark.parametrize("name", ["localtime", "posixrules", "Factory", "right/UTC", "Mars/Base"])
def test_a_zone_that_is_not_a_place_is_refused_by_name(name):
    with pytest.raises(InvalidSchedule, match=f"Unknown time zone '{name}'"):
        zone(name)


def test_a_listed_zone_whose_file_cannot_be_read_is_refused_by_name(monkeypatch):
    """The host's database lists it but its file is gone or unreadable (tzdata
    changed under a running process): the same message, naming it."""
    from payments import calendar

    monkeypatch.setattr(calendar, "_places", lambda: frozenset({"Nowhere/Town", "America"}))
    for name in ("Nowhere/Town", "America"):  # no such file; a folder of the database
        with pytest.raises(InvalidSchedule, match=f"Unknown time zone '{name}'"):
            zone(name)
