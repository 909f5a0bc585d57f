"""Batch jobs' bounded loop: one transaction a batch, until done or out of time."""

from __future__ import annotations

import time
from collections.abc import Callable

from django.db import transaction


def in_batches(step: Callable[[], int], batch: int, deadline: float) -> int:
    """``step()`` (one transaction each; it returns how many rows it handled) until
    it handles fewer than ``batch`` or the ``time.monotonic()`` ``deadline``
    passes; the rows handled in all."""
    done = 0
    while time.monotonic() < deadline:
        with transaction.atomic():
            handled = step()
        done += handled
        if handled < batch:
            break
    return done
