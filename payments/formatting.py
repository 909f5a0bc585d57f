"""One way to show a duration to people (admin lists, the operations page).

Milliseconds with one decimal and thousands separators ("412.3 ms",
"35,012.0 ms"), so values of any size line up and compare at a glance; past a
minute the same figure is followed by a rough reading ("(2 min 5 s)").
"""

from __future__ import annotations

from datetime import timedelta


def duration_ms(value: float | timedelta | None, *, empty: str = "-") -> str:
    """``value`` in seconds (or a timedelta), as milliseconds with one decimal."""
    if value is None:
        return empty
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    text = f"{seconds * 1000:,.1f} ms"
    if abs(seconds) >= 60:
        text += f" ({rough(seconds)})"
    return text


def rough(seconds: float) -> str:
    """The two largest units: "2 min 5 s", "3 h 0 min", "4 d 1 h"."""
    whole = int(abs(seconds))
    units = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))
    first = next(i for i, (_, size) in enumerate(units) if whole >= size or size == 1)
    parts = []
    for unit, size in units[first : first + 2]:
        parts.append(f"{whole // size} {unit}")
        whole %= size
    return ("-" if seconds < 0 else "") + " ".join(parts)
