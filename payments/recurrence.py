"""Occurrence times of recurring payments, with explicit calendar policies (DESIGN §4.2).

Pure functions, no database. A cron expression (5 fields, ``L`` = last day of
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

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

NONEXISTENT_POLICIES = ("shift", "skip")
AMBIGUOUS_POLICIES = ("first", "last", "both")
MAX_GAP = timedelta(hours=3)  # longest DST gap searched when shifting


class InvalidSchedule(ValueError):
    pass


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidSchedule(f"Unknown time zone {name!r}.") from None


def validate_cron(expr: str) -> str:
    fields = expr.split()
    if len(fields) != 5:
        raise InvalidSchedule("A cron expression has 5 fields: minute hour day month weekday.")
    if not croniter.is_valid(expr):
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

    Stops at ``end_time`` (inclusive). Instants are unique even when a
    shifted wall time lands on another occurrence.
    """
    start = spec.start_time
    floor = after if after is not None and after >= start else start - timedelta(microseconds=1)
    if spec.interval_seconds:
        step = timedelta(seconds=spec.interval_seconds)
        k = max(0, (floor - start) // step + 1) if floor >= start else 0
        while True:
            instant = start + k * step
            if spec.end_time is not None and instant > spec.end_time:
                return
            if instant > floor:
                yield instant
            k += 1
    tz = zone(spec.timezone)
    # Iterate wall times from the local time of the floor instant; croniter on
    # naive datetimes walks the local calendar without DST arithmetic.
    local_floor = floor.astimezone(tz).replace(tzinfo=None)
    it = croniter(spec.cron, local_floor - timedelta(hours=3))
    last = floor
    while True:
        local = it.get_next(datetime)
        for instant in resolve_local(
            local, tz, nonexistent=spec.nonexistent, ambiguous=spec.ambiguous
        ):
            if spec.end_time is not None and instant > spec.end_time:
                return
            if instant > last:
                last = instant
                yield instant


def upcoming(spec: Spec, *, after: datetime | None, count: int) -> list[datetime]:
    result = []
    for instant in occurrences(spec, after=after):
        result.append(instant)
        if len(result) >= count:
            break
    return result
