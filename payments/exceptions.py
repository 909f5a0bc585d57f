"""Domain errors of payments; like ``LedgerError`` each has a stable ``code``.

Not ``LedgerError`` subclasses: both derive from the neutral
``scheduler_project.errors.DomainError``, so code that handles the ledger's
refusals (the executor failing a payment, the materialiser failing an
occurrence) cannot catch a payments error by accident.
"""

from __future__ import annotations

from scheduler_project.errors import DomainError


class PaymentError(DomainError):
    """A payment rule refused the operation; nothing was written."""

    code = "payment_error"


class NotFound(PaymentError):
    """The object does not exist or belongs to another client."""

    code = "not_found"


class InvalidRequest(PaymentError):
    """The request breaks an input rule (see ``details``)."""

    code = "validation_error"

    @classmethod
    def field(cls, name: str, message: str, **details: object) -> InvalidRequest:
        """One field's rule, worded like the API's input validation: ``details.fields``
        carries ``message`` under ``name``, and the error's message is ``"name: message"``."""
        return cls(f"{name}: {message}", fields={name: message}, **details)


class PaymentNotCancellable(PaymentError):
    """Only PENDING or QUEUED payments can be cancelled."""

    code = "payment_not_cancellable"


class PaymentNotModifiable(PaymentError):
    """Only PENDING or QUEUED payments can be changed."""

    code = "payment_not_modifiable"


class IdempotencyKeyInUse(PaymentError):
    """A request with this Idempotency-Key is still being processed."""

    code = "idempotency_key_in_use"


class IdempotencyClaimLost(IdempotencyKeyInUse):
    """This request outlived its claim and a retry took it over: its work is rolled back."""


class IdempotencyKeyReused(PaymentError):
    """This Idempotency-Key was used with a different request."""

    code = "idempotency_key_reused"


class PaymentNotDue(PaymentError):
    """The payment's scheduled time has not come; nothing runs early."""

    code = "payment_not_due"


class LimitExceeded(PaymentError):
    """A per-client quota (active recurring schedules, webhook endpoints) is used up."""

    code = "limit_exceeded"


class RecurringNotChangeable(PaymentError):
    """The schedule has ended or was cancelled."""

    code = "recurring_not_modifiable"


class InvalidSchedule(ValueError):
    """A cron expression, time zone or DST policy the occurrence calendar cannot use.

    A ``ValueError`` of the calendar maths (``payments.calendar``); services turn
    it into ``InvalidRequest`` on the field concerned.
    """
