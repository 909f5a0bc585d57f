"""Input rules shared by the one-off and the recurring payment services.

Each rule is written once and answers with one wording, so a one-off payment
and a recurring schedule are refused alike (DESIGN §8), and the API's input
serializers quote the same texts.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser

from ledger.exceptions import AccountNotActive, AccountNotFound
from ledger.models import Account, AccountStatus

from ..clock import iso_timestamp
from ..exceptions import InvalidRequest

ONE_OF_DELAY_OR_TIME = "Give exactly one of delay_seconds or scheduled_time."
SAME_ACCOUNT = "Must differ from from_account_id."


def delay_seconds_rule() -> str:
    """The one wording of the ``delay_seconds`` bounds (API input check and service)."""
    low, high = settings.PAYMENT_MIN_DELAY_SECONDS, settings.PAYMENT_MAX_DELAY_SECONDS
    return f"Must be between {low} and {high} seconds."


def check_distinct(from_account_id: int, to_account_id: int) -> None:
    """A payment or schedule moves money between two different accounts."""
    if from_account_id == to_account_id:
        raise InvalidRequest.field("to_account_id", SAME_ACCOUNT)


def check_amount(amount: int, account: Account) -> None:
    """At most the source account's ``max_payment_amount`` (set per account by staff)."""
    limit = account.max_payment_amount
    if amount > limit:
        raise InvalidRequest.field(
            "amount",
            f"Must be at most {limit}, this account's max_payment_amount.",
            account_id=account.pk,
            max_payment_amount=limit,
        )


def resolve_due_at(
    *, now: datetime, delay_seconds: int | None = None, scheduled_time: datetime | None = None
) -> datetime:
    """Turn ``delay_seconds`` or ``scheduled_time`` into a due instant, within bounds."""
    if (delay_seconds is None) == (scheduled_time is None):
        raise InvalidRequest.field("delay_seconds", ONE_OF_DELAY_OR_TIME)
    min_delay = settings.PAYMENT_MIN_DELAY_SECONDS
    max_delay = settings.PAYMENT_MAX_DELAY_SECONDS
    if delay_seconds is not None:
        if not min_delay <= delay_seconds <= max_delay:
            raise InvalidRequest.field("delay_seconds", delay_seconds_rule())
        return now + timedelta(seconds=delay_seconds)
    assert scheduled_time is not None
    if scheduled_time < now:
        raise InvalidRequest.field(
            "scheduled_time", "Must not be in the past.", now=iso_timestamp(now)
        )
    if scheduled_time > now + timedelta(seconds=max_delay):
        raise InvalidRequest.field("scheduled_time", f"Must be at most {max_delay} seconds ahead.")
    return scheduled_time


def payable_destination(*, client: AbstractBaseUser, account_id: int) -> Account:
    """The account ``client`` may pay into, or the one refusal the API answers.

    The client's own account only has to be active, and if it is not the
    client is told its status (``account_not_active``): it is theirs to know.
    Any other account must exist, be a client account (no ``system_code``:
    issuance and other system accounts are not payable) and be active.
    Unknown, system, frozen and closed all raise the same ``AccountNotFound``
    with the same message apart from the id, so scheduling cannot be used to
    learn anything about another client's account or about system accounts.

    An unlocked read: the executor checks the destination again under its
    row lock, so a destination frozen after scheduling fails the payment then.
    """
    account = (
        Account.objects.filter(pk=account_id)
        .only("pk", "owner_id", "system_code", "status")
        .first()
    )
    return check_payable(client=client, account_id=account_id, account=account)


def check_payable(*, client: AbstractBaseUser, account_id: int, account: Account | None) -> Account:
    """``payable_destination`` on an account the caller has read (None: no such row)."""
    if account is not None and account.owner_id is not None and account.owner_id == client.pk:
        if account.status != AccountStatus.ACTIVE:
            raise AccountNotActive(
                f"Account {account_id} is {account.status}.",
                account_id=account_id,
                status=account.status,
            )
        return account
    if account is None or account.system_code is not None or account.status != AccountStatus.ACTIVE:
        raise AccountNotFound(
            f"Account {account_id} does not exist or cannot receive payments.",
            account_id=account_id,
        )
    return account
