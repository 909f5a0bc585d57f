"""What the API, the admin and operators call to change things (by entity).

- ``payments``: schedule, change, cancel, retry and execute one-off payments;
- ``recurring``: create, change, pause, resume and cancel recurring schedules;
- ``rules``: the input rules both share.

The public services are re-exported here (``services.payment_schedule``).
"""

from .payments import (
    payment_cancel,
    payment_execute_now,
    payment_retry_dead_letter,
    payment_schedule,
    payment_update,
)
from .recurring import recurring_create, recurring_set_status, recurring_update

__all__ = [
    "payment_cancel",
    "payment_execute_now",
    "payment_retry_dead_letter",
    "payment_schedule",
    "payment_update",
    "recurring_create",
    "recurring_set_status",
    "recurring_update",
]
