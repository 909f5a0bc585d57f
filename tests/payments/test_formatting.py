"""Durations read the same everywhere in the back office: milliseconds, one decimal."""

from datetime import timedelta

import pytest

from payments.formatting import duration_ms


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "-"),
        (0, "0.0 ms"),
        (0.00004, "0.0 ms"),
        (0.4123, "412.3 ms"),
        (timedelta(milliseconds=1500), "1,500.0 ms"),
        (35.01234, "35,012.3 ms"),
        (59.9, "59,900.0 ms"),
        (125, "125,000.0 ms (2 min 5 s)"),
        (timedelta(hours=3, seconds=5), "10,805,000.0 ms (3 h 0 min)"),
        (timedelta(days=1, hours=1, minutes=1), "90,060,000.0 ms (1 d 1 h)"),
    ],
)
def test_duration_ms(value, text):
    assert duration_ms(value) == text
