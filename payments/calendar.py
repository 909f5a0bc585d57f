"""The occurrence calendar: when a recurring schedule runs (DESIGN §4.2).

Pure functions, no database (the helpers at the end read a
``RecurringPayment``'s fields, nothing else). A cron expression (5 fields, ``L`` = last day of
the month, via croniter) is evaluated on the *local wall clock* of an IANA
time zone; each wall time is then mapped to UTC instants under the DST
policy:

- a wall time that does not exist (spring forward, e.g. 02:30 in New York on
  the second Sunday of March): ``shift`` runs at the first valid local time
  after the gap (03:00), ``skip`` drops it;
- a wall time that occurs twice (fall back, 01:30 on the first Sunday of
  November): ``first`` runs at the earlier instant (EDT), ``last`` at the later
  (EST), ``both`` at both.

Interval schedules are plain UTC arithmetic from ``start_time``; DST does not
apply to them.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import CroniterError, croniter

from .exceptions import InvalidSchedule
from .models import RecurringPayment, RecurringStatus

NONEXISTENT_POLICIES = ("shift", "skip")
AMBIGUOUS_POLICIES = ("first", "last", "both")
MAX_GAP = timedelta(hours=3)  # longest DST gap searched when shifting


# Names a host's zoneinfo answers that are not a place's calendar: "localtime"
# is whatever /etc/localtime of the host evaluating it says (two materialisers
# on hosts set differently would disagree on an occurrence's instant),
# "posixrules" the host's default rules, "Factory" a placeholder; the posix/
# and right/ trees (leap seconds) are the host's too.
HOST_ZONES = frozenset({"localtime", "posixrules", "Factory"})


@functools.cache
def _places() -> frozenset[str]:
    """The IANA zone names of this host's tz database (read once a process)."""
    return frozenset(available_timezones()) - HOST_ZONES


def zone(name: str) -> ZoneInfo:
    if name not in _places():
        raise InvalidSchedule(f"Unknown time zone {name!r}.")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # OSError: a folder of the tz database ("America": IsADirectoryError)
        raise InvalidSchedule(f"Unknown time zone {name!r}.") from None


# Words a field may hold: L (last day), W (nearest weekday) and month and day
# names. croniter also reads R (a random value, drawn again at every
# evaluation: a "daily" schedule would run at a different time each read, and
# twice or not at all some days) and H (a hash of an id we never give it):
# neither is a calendar.
CRON_WORDS = frozenset(
    [
        "L",
        "W",
        *["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"],
        *["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
    ]
)


def validate_cron(expr: str) -> str:
    fields = expr.split()
    if len(fields) != 5:
        raise InvalidSchedule("A cron expression has 5 fields: minute hour day month weekday.")
    words = {w.upper() for w in re.findall(r"[^\W\d_]+", expr)}
    if not words <= CRON_WORDS or not croniter.is_valid(expr):
        raise InvalidSchedule(f"Invalid cron expression {expr!r}.")
    return " ".join(fields)


def _exists(local: datetime, tz: ZoneInfo) -> bool:
    aware = local.replace(tzinfo=tz)
    return aware.astimezone(UTC).astimezone(tz).replace(tzinfo=None) == local


def resolve_local(
    local: datetime, tz: ZoneInfo, *, nonexistent: str, ambiguous: str
) -> list[datetime]:
    """UTC instants for a naive local wall time under the DST policies (maybe none)."""
    earlier = local.replace(tzinfo=tz, fold=0).astimezone(UTC)
    later = local.replace(tzinfo=tz, fold=1).astimezone(UTC)
    if earlier == later:
        return [earlier]
    if _exists(local, tz):  # repeated wall time (fall back)
        first, last = sorted((earlier, later))
        return {"first": [first], "last": [last], "both": [first, last]}[ambiguous]
    if nonexistent == "skip":  # wall time in a gap (spring forward)
        return []
    candidate = local.replace(second=0, microsecond=0)
    while candidate - local < MAX_GAP:
        candidate += timedelta(minutes=1)
        if _exists(candidate, tz):
            return [candidate.replace(tzinfo=tz).astimezone(UTC)]
    raise InvalidSchedule(f"No valid local time after {local} in {tz.key}.")  # pragma: no cover


@dataclass(frozen=True)
class Spec:
    """What a schedule needs to enumerate its occurrences."""

    cron: str | None
    interval_seconds: int | None
    timezone: str
    start_time: datetime
    end_time: datetime | None = None
    nonexistent: str = "shift"
    ambiguous: str = "first"


def occurrences(spec: Spec, *, after: datetime | None) -> Iterator[datetime]:
    """UTC instants strictly after ``after`` (from ``start_time`` if None), ascending.

    Lazy: a caller takes only what its horizon needs, so the cost never grows
    with how far ahead a schedule reaches. Stops at ``end_time`` (inclusive)
    and where the calendar ends: a cron expression with no further match
    (croniter gives up) or an instant past ``datetime.max`` (year 9999) ends
    the sequence instead of raising. Instants are unique even when a shifted
    wall time lands on another occurrence.
    """
    start = spec.start_time
    floor = after if after is not None and after >= start else start - timedelta(microseconds=1)
    try:
        yield from _interval(spec, floor) if spec.interval_seconds else _cron(spec, floor)
    except (OverflowError, CroniterError):
        return  # CroniterError: no further match; OverflowError: past year 9999


def _interval(spec: Spec, floor: datetime) -> Iterator[datetime]:
    start = spec.start_time
    step = timedelta(seconds=spec.interval_seconds)
    k = max(0, (floor - start) // step + 1) if floor >= start else 0
    while True:
        instant = start + k * step
        if spec.end_time is not None and instant > spec.end_time:
            return
        if instant > floor:
            yield instant
        k += 1


def _cron(spec: Spec, floor: datetime) -> Iterator[datetime]:
    tz = zone(spec.timezone)
    # Iterate wall times from the local time of the floor instant; croniter on
    # naive datetimes walks the local calendar without DST arithmetic. Near a
    # DST change a wall time a little before the floor's can still land after
    # it (shifted out of a gap, or the later of a repeated hour), so start
    # that much earlier; elsewhere start right at the floor, so an
    # every-minute cron costs one step per instant, not hours of steps.
    local_floor = floor.astimezone(tz).replace(tzinfo=None)
    it = croniter(spec.cron, local_floor - _dst_margin(floor, tz))
    # Wall times come in order, their instants need not: in a repeated hour
    # (``both``) 01:00 EST comes after 01:15 EDT. Instants wait in a heap until
    # no later wall time can give an earlier one (below ``bound``).
    pending: list[datetime] = []
    last = floor
    while True:
        bound = _next_wall_time(it, tz, spec, pending)
        while pending and (bound is None or pending[0] <= bound):
            instant = heapq.heappop(pending)
            if spec.end_time is not None and instant > spec.end_time:
                return
            if instant > last:
                last = instant
                yield instant
        if bound is None or (spec.end_time is not None and bound > spec.end_time):
            return


def _next_wall_time(it: croniter, tz: ZoneInfo, spec: Spec, pending: list) -> datetime | None:
    """Push the next wall time's instants onto ``pending``; return the earliest
    instant any later wall time can still give, or None where the calendar
    ends (no further match, or past year 9999: what waits is all there is)."""
    try:
        local = it.get_next(datetime)
    except (CroniterError, ValueError, OverflowError):  # "year 10000 is out of range"
        return None
    try:
        instants = resolve_local(local, tz, nonexistent=spec.nonexistent, ambiguous=spec.ambiguous)
        earliest = local.replace(tzinfo=tz, fold=0).astimezone(UTC)
    except OverflowError:  # this wall time is past datetime.max in UTC
        return None
    for instant in instants:
        heapq.heappush(pending, instant)
    try:
        return earliest - _dst_margin(earliest, tz)
    except OverflowError:  # within MAX_GAP of datetime.max (or min): the widest margin
        try:
            return earliest - MAX_GAP - timedelta(minutes=1)
        except OverflowError:
            return datetime.min.replace(tzinfo=UTC)


def _dst_margin(instant: datetime, tz: ZoneInfo) -> timedelta:
    """How far before ``instant``'s wall time the enumeration must start: the size of
    any UTC-offset change within ``MAX_GAP`` of it (plus a minute), else nothing."""
    offset = instant.astimezone(tz).utcoffset()
    change = max(
        abs((instant + delta).astimezone(tz).utcoffset() - offset) for delta in (-MAX_GAP, MAX_GAP)
    )
    return change + timedelta(minutes=1) if change else timedelta(0)


def upcoming(spec: Spec, *, after: datetime | None, count: int) -> list[datetime]:
    return list(itertools.islice(occurrences(spec, after=after), count))


# --- a schedule's occurrences ---------------------------------------------------------

UPCOMING_COUNT = 5


def spec_of(schedule: RecurringPayment) -> Spec:
    """The calendar of a ``RecurringPayment``."""
    return Spec(
        cron=schedule.cron or None,
        interval_seconds=schedule.interval_seconds,
        timezone=schedule.timezone,
        start_time=schedule.start_time,
        end_time=schedule.end_time,
        nonexistent=schedule.dst_nonexistent,
        ambiguous=schedule.dst_ambiguous,
    )


def planned(schedule: RecurringPayment, count: int = UPCOMING_COUNT) -> list[datetime]:
    """A schedule's next planned occurrence instants (empty once ended or cancelled)."""
    if schedule.status in (RecurringStatus.ENDED, RecurringStatus.CANCELLED):
        return []
    remaining = None
    if schedule.max_occurrences is not None:
        remaining = schedule.max_occurrences - schedule.occurrences_run
        if remaining <= 0:
            return []
    times = upcoming(spec_of(schedule), after=schedule.last_occurrence_at, count=count)
    return times[:remaining] if remaining is not None else times


def jitter_for(schedule: RecurringPayment, instant: datetime) -> timedelta:
    """Deterministic spread in [0, jitter_seconds]: stable across retries and nodes."""
    if not schedule.jitter_seconds:
        return timedelta(0)
    digest = hashlib.sha256(f"{schedule.pk}:{instant.isoformat()}".encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2**64
    return timedelta(seconds=round(fraction * schedule.jitter_seconds, 3))
