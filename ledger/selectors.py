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

    Keyset-paginated on the posting id: pass the last id of a page as
    ``before_posting_id`` to get the next one. A page is one backward range
    of ``ledger_posting_statement`` (account, id) starting at the cursor, so
    page 1,000 costs what page 1 does.

    ``a <= account_id <= a`` rather than ``account_id = a``, with the account in
    the ORDER BY: with ``=`` PostgreSQL knows the account is a constant, drops
    it from the ordering, and for a busy account often walks the primary key
    backwards from the cursor instead, filtering out every other account's
    postings on the way (as many rows as the whole ledger has below the
    cursor when the account was quiet there). With the range, only the
    statement index yields the order without a sort.
    """
    qs = Posting.objects.filter(account_id__gte=account_id, account_id__lte=account_id)
    qs = qs.select_related("entry")
    if before_posting_id is not None:
        qs = qs.filter(pk__lt=before_posting_id)
    return list(qs.order_by("-account_id", "-pk")[:limit])
