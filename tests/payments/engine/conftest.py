"""Fixtures of the timer tests: both code paths, a frozen database clock."""

from tests.payments.engine.timer import frozen_clock, portable_clock, timer_path  # noqa: F401
