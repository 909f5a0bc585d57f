"""Read side of the ledger."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from .models import Account, Posting


def account_list_for_owner(*, owner: AbstractBaseUser) -> QuerySet[Account]:
    return Account.objects.filter(owner=owner).order_by("pk")


def account_get_for_owner(*, owner: AbstractBaseUser, account_id: int) -> Account | None:
    return Account.objects.filter(owner=owner, pk=account_id).first()


def account_statement(
    *, account_id: int, before_posting_id: int | None = None, limit: int = 50
) -> list[Posting]:
    """Postings of an account, newest first, each with the balance after it.

    Keyset-paginated on the posting id (index ``ledger_posting_statement``):
    pass the last id of a page as ``before_posting_id`` to get the next one.
    """
    qs = Posting.objects.filter(account_id=account_id).select_related("entry")
    if before_posting_id is not None:
        qs = qs.filter(pk__lt=before_posting_id)
    return list(qs.order_by("-pk")[:limit])
