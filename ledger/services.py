"""Write side of the ledger.

Every movement of money goes through :class:`LedgerBatch`, a unit of work that

1. locks the accounts it may touch in ascending primary-key order
   (``SELECT … FOR NO KEY UPDATE``), then the holds it may touch, so two
   batches can never deadlock on each other. ``NO KEY``: a balance change
   never changes a key, and this lock, unlike ``FOR UPDATE``, does not block
   the ``FOR KEY SHARE`` that PostgreSQL's deferred foreign-key checks take at
   COMMIT — with ``FOR UPDATE``, two payments scheduled at once between the
   same two accounts in opposite directions deadlocked in their COMMITs;
2. applies operations to the locked in-memory rows, validating each one first:
   an operation either applies completely or raises :class:`LedgerError`
   leaving the batch as it was, so one bad transfer does not spoil a batch;
3. writes everything in :meth:`LedgerBatch.flush` with bulk statements: one
   INSERT for entries, one for postings, one UPDATE per changed table.

With ``lock_accounts_last=True`` (the executor's batches) step 1 only *reads*
the accounts; operations are checked against that snapshot, and
:meth:`LedgerBatch.flush` writes entries and holds but not postings or
balances. :meth:`LedgerBatch.flush_balances`, called last before COMMIT,
locks the changed accounts (same order), re-checks what the operations relied
on against the locked rows (status, overdraft rule, funds where the batch
lowers them: else ``StaleAccounts`` and the caller runs again with the
accounts locked first), applies the batch's changes to the locked balances,
computes each posting's ``balance_after`` from them and writes postings and
balances. On PostgreSQL that is two statements in one round trip: the lock,
then the checks and the balance UPDATE; the account rows stay locked for
them, the postings' INSERT and the COMMIT instead of the whole batch: a
schedule request placing a hold on one of them, or another batch, waits that
long and no longer.

The single-operation services below (``transfer_post``, ``hold_place``, …)
are one-operation batches, each in its own transaction.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from .db import (
    binary_cursor,
    bulk_insert_rows,
    bulk_update_rows,
    instances,
    pipelined,
    select_list,
)
from .exceptions import (
    AccountNotActive,
    AccountNotFound,
    DuplicateReference,
    EntryAlreadyReversed,
    HoldMismatch,
    HoldNotActive,
    InsufficientFunds,
    InvalidAmount,
    LedgerError,
    SameAccount,
    StaleAccounts,
    SystemAccountProtected,
)
from .models import (
    Account,
    AccountStatus,
    EntryKind,
    Hold,
    HoldStatus,
    JournalEntry,
    Posting,
)

# What a batch reads of an account: not its name or timestamps, which no
# operation checks (parsing two timestamps per account showed in the
# executor's profile at small batches). ``updated_at`` is written, not read.
BATCH_ACCOUNT_FIELDS = (
    "id",
    "owner_id",
    "system_code",
    "balance",
    "held",
    "version",
    "status",
    "max_payment_amount",
    "allow_negative",
)


def read_accounts(account_ids: Iterable[int]) -> dict[int, Account]:
    """The given accounts by id as a ``lock_accounts_last`` batch reads them: no
    lock, ``BATCH_ACCOUNT_FIELDS`` only."""
    accounts = Account.objects.filter(pk__in=set(account_ids)).only(*BATCH_ACCOUNT_FIELDS)
    return {a.pk: a for a in accounts}


def read_accounts_with_clock(
    account_ids: Iterable[int],
) -> tuple[datetime | None, dict[int, Account]]:
    """PostgreSQL: ``read_accounts`` and the database clock in one statement of
    its own — the clock as the first account (by id) is read, None when no
    account exists. The schedule request reads its two accounts so; as a
    queryset (``read_accounts``' with the clock annotated) compiling it took a
    sixth of the request's CPU."""
    ids = sorted(set(account_ids))
    fields = frozenset(BATCH_ACCOUNT_FIELDS)
    with binary_cursor(binary_results=True) as cursor:
        cursor.execute(_ACCOUNTS_WITH_CLOCK_SQL.format(columns=select_list(Account, fields)), [ids])
        rows = cursor.fetchall()
    accounts = instances(Account, fields, (row[1:] for row in rows))
    return (rows[0][0] if rows else None), {a.pk: a for a in accounts}


T = TypeVar("T")


def locking_accounts_last(
    work: Callable[[bool], T], *, on_stale: Callable[[StaleAccounts], None] | None = None
) -> T:
    """``work(True)``: a unit of work whose batch locks its accounts last; if it
    raises ``StaleAccounts`` (``work`` owns its transaction, rolled back by then),
    ``on_stale`` is told and ``work(False)`` runs it again locking them first —
    the answer a locked read gives. ``work``'s argument is ``lock_accounts_last``."""
    try:
        return work(True)
    except StaleAccounts as exc:
        if on_stale is not None:
            on_stale(exc)
        return work(False)


def lock_accounts(account_ids: Iterable[int]) -> dict[int, Account]:
    """Lock the given accounts in ascending id order and return them by id.

    The one place account row locks are taken: a fixed global order means
    concurrent batches wait for each other instead of deadlocking.
    Caller must be inside ``transaction.atomic()``.
    """
    ids = sorted(set(account_ids))
    return {
        a.pk: a
        for a in Account.objects.filter(pk__in=ids).order_by("pk").select_for_update(no_key=True)
    }


def _read_or_lock(account_ids: Iterable[int], *, lock: bool) -> dict[int, Account]:
    return (lock_accounts if lock else read_accounts)(account_ids)


# LedgerBatch's reads on PostgreSQL, sent in one round trip (a pipeline) as
# statements of their own rather than three compiled querysets: the accounts
# (read, or locked in id order), then the holds (locked in id order: after the
# accounts, as the lock order wants), then which references are taken.
_BATCH_ACCOUNTS_SQL = 'SELECT {columns} FROM "ledger_account" WHERE id = ANY(%b::bigint[])'
_BATCH_LOCK_ACCOUNTS_SQL = _BATCH_ACCOUNTS_SQL + " ORDER BY id FOR NO KEY UPDATE"
# read_accounts_with_clock: the unlocked read, with the clock of its first row by id
_ACCOUNTS_WITH_CLOCK_SQL = (
    _BATCH_ACCOUNTS_SQL.replace("SELECT ", "SELECT clock_timestamp(), ", 1) + " ORDER BY id"
)
_BATCH_LOCK_HOLDS_SQL = (
    'SELECT {columns} FROM "ledger_hold" WHERE id = ANY(%b::bigint[]) ORDER BY id FOR NO KEY UPDATE'
)
_BATCH_TAKEN_REFERENCES_SQL = (
    'SELECT reference FROM "ledger_journalentry" WHERE reference = ANY(%b::text[])'
)
_ALL_ACCOUNT_FIELDS = frozenset(f.attname for f in Account._meta.concrete_fields)
_ALL_HOLD_FIELDS = frozenset(f.attname for f in Hold._meta.concrete_fields)


def _read_batch(
    *,
    account_ids: Iterable[int] | None,
    lock_accounts: bool,
    hold_ids: list[int],
    references: list[str],
) -> tuple[dict[int, Account] | None, dict[int, Hold], set[str]]:
    """What a ``LedgerBatch`` reads before its operations (PostgreSQL): the
    accounts (None without ``account_ids``; locked with ``lock_accounts``, else
    the ``BATCH_ACCOUNT_FIELDS`` read unlocked), the holds locked, and the
    references already posted — the same rows and locks, in the same order, as
    ``lock_accounts``/``read_accounts`` and the two querysets of the SQLite form."""
    account_fields = _ALL_ACCOUNT_FIELDS if lock_accounts else frozenset(BATCH_ACCOUNT_FIELDS)
    statements = []  # (what, SQL, parameters), in lock order
    ids = sorted(set(account_ids)) if account_ids is not None else []
    if ids:  # none: no statement, as Django answers an empty IN
        sql = _BATCH_LOCK_ACCOUNTS_SQL if lock_accounts else _BATCH_ACCOUNTS_SQL
        columns = select_list(Account, account_fields)
        statements.append(("accounts", sql.format(columns=columns), [ids]))
    if hold_ids:
        columns = select_list(Hold, _ALL_HOLD_FIELDS)
        statements.append(("holds", _BATCH_LOCK_HOLDS_SQL.format(columns=columns), [hold_ids]))
    if references:
        statements.append(("references", _BATCH_TAKEN_REFERENCES_SQL, [references]))
    rows: dict[str, list[tuple]] = {}
    if statements:
        with contextlib.ExitStack() as stack:
            if len(statements) > 1:
                stack.enter_context(pipelined())
            sent = []
            for what, sql, params in statements:
                cursor = stack.enter_context(binary_cursor(binary_results=True))
                cursor.execute(sql, params)
                sent.append((what, cursor))
            rows = {what: cursor.fetchall() for what, cursor in sent}
    accounts = (
        {a.pk: a for a in instances(Account, account_fields, rows.get("accounts", ()))}
        if account_ids is not None
        else None
    )
    holds = {h.pk: h for h in instances(Hold, _ALL_HOLD_FIELDS, rows.get("holds", ()))}
    return accounts, holds, {r for (r,) in rows.get("references", ())}


@dataclass(frozen=True)
class Leg:
    account_id: int
    amount: int


class LedgerBatch:
    """A unit of work over a set of locked accounts.

    Caller must be inside ``transaction.atomic()``; the locks are held until it
    commits. ``account_ids`` must include every account an operation will
    touch (an account outside the set is reported as not found), and
    ``hold_ids`` every hold that will be captured or released.
    ``references`` may list entry references the caller will post, so that
    duplicates are found with one query instead of one per entry.
    ``lock_accounts_last``: read the accounts now, lock them in
    :meth:`flush_balances` (module docstring); ``read``, with it: the accounts
    as the caller has just read them without locks, instead of reading them
    again.
    """

    def __init__(
        self,
        *,
        account_ids: Iterable[int],
        hold_ids: Iterable[int] = (),
        references: Iterable[str] = (),
        lock_accounts_last: bool = False,
        read: dict[int, Account] | None = None,
    ) -> None:
        self._lock_last = lock_accounts_last
        hold_ids = sorted(set(hold_ids))
        references = list(references)
        given = read is not None and lock_accounts_last
        if connection.vendor == "postgresql":
            accounts, self.holds, self._taken_references = _read_batch(
                account_ids=None if given else account_ids,
                lock_accounts=not lock_accounts_last,
                hold_ids=hold_ids,
                references=references,
            )
        else:
            accounts = None if given else _read_or_lock(account_ids, lock=not lock_accounts_last)
            self.holds = (
                {
                    h.pk: h
                    for h in Hold.objects.filter(pk__in=hold_ids)
                    .order_by("pk")
                    .select_for_update(no_key=True)
                }
                if hold_ids
                else {}
            )
            self._taken_references = (
                set(
                    JournalEntry.objects.filter(reference__in=references).values_list(
                        "reference", flat=True
                    )
                )
                if references
                else set()
            )
        # the caller read them, unlocked, in a query of its own (a schedule
        # request reads the destination and the clock in the same one);
        # locked first, a batch always reads them itself
        self.accounts = (
            {aid: read[aid] for aid in set(account_ids) if aid in read} if given else accounts
        )
        # what was read, for flush_balances to carry the batch's changes onto the locked rows
        self._read = (
            {aid: (a.balance, a.held, a.version) for aid, a in self.accounts.items()}
            if lock_accounts_last
            else {}
        )
        self._checked_references: set[str] = set(references)
        self._entries: list[JournalEntry] = []
        self._postings: list[Posting] = []
        self._new_holds: list[Hold] = []
        self._changed_holds: dict[int, Hold] = {}
        self._changed_accounts: set[int] = set()
        self._now = timezone.now()

    # -- lookups ---------------------------------------------------------
    def account(self, account_id: int) -> Account:
        try:
            return self.accounts[account_id]
        except KeyError:
            raise AccountNotFound(
                f"Account {account_id} does not exist.", account_id=account_id
            ) from None

    def _hold(self, hold_id: int) -> Hold:
        hold = self.holds.get(hold_id)
        if hold is None or hold.status != HoldStatus.ACTIVE:
            raise HoldNotActive(
                f"Hold {hold_id} is not active.",
                hold_id=hold_id,
                status=hold.status if hold else None,
            )
        return hold

    def _check_reference(self, reference: str | None) -> None:
        if reference is None:
            return
        if reference not in self._checked_references:
            self._checked_references.add(reference)
            if JournalEntry.objects.filter(reference=reference).exists():
                self._taken_references.add(reference)
        if reference in self._taken_references:
            raise DuplicateReference(
                f"An entry with reference {reference!r} is already posted.", reference=reference
            )

    @staticmethod
    def _check_usable(account: Account, *, allow_frozen: bool) -> None:
        if account.status == AccountStatus.ACTIVE:
            return
        if allow_frozen and account.status == AccountStatus.FROZEN:
            return
        raise AccountNotActive(
            f"Account {account.pk} is {account.status}.",
            account_id=account.pk,
            status=account.status,
        )

    def _touch(self, account: Account) -> None:
        account.version += 1
        account.updated_at = self._now
        self._changed_accounts.add(account.pk)

    # -- operations ------------------------------------------------------
    def post_entry(
        self,
        *,
        kind: str,
        legs: Sequence[Leg],
        reference: str | None = None,
        description: str = "",
        hold_id: int | None = None,
        created_by: AbstractBaseUser | None = None,
        reverses: JournalEntry | None = None,
        allow_frozen: bool = False,
    ) -> JournalEntry:
        """Validate and apply one balanced entry; nothing changes if it raises.

        Checks run in a fixed order, so the first broken rule is the one
        reported: shape and reference, accounts exist, hold, accounts usable,
        funds.

        With ``hold_id`` the entry captures that hold: the hold must be active,
        on the one debited account, for exactly the debited amount; the funds it
        reserved pay for the entry.
        """
        if len(legs) < 2 or any(leg.amount == 0 for leg in legs):
            raise InvalidAmount("An entry needs two or more non-zero postings.")
        if sum(leg.amount for leg in legs) != 0:
            raise InvalidAmount("The postings of an entry must sum to zero.")
        self._check_reference(reference)
        net: dict[int, int] = {}
        for leg in legs:
            net[leg.account_id] = net.get(leg.account_id, 0) + leg.amount
        accounts = {aid: self.account(aid) for aid in net}

        hold = None
        released_by_capture: dict[int, int] = {}
        if hold_id is not None:
            hold = self._hold(hold_id)
            debits = [aid for aid, amount in net.items() if amount < 0]
            if debits != [hold.account_id] or -net[hold.account_id] != hold.amount:
                raise HoldMismatch(
                    f"Hold {hold.pk} ({hold.amount} on account {hold.account_id}) "
                    "does not match this entry.",
                    hold_id=hold.pk,
                )
            released_by_capture[hold.account_id] = hold.amount

        for account in accounts.values():
            self._check_usable(account, allow_frozen=allow_frozen)

        for aid, amount in net.items():
            account = accounts[aid]
            if amount >= 0 or account.allow_negative:
                continue
            available_after = account.available + released_by_capture.get(aid, 0) + amount
            if available_after < 0:
                raise InsufficientFunds(
                    f"Account {aid} has {account.available} available; {-amount} needed.",
                    account_id=aid,
                    available=account.available,
                    required=-amount,
                )

        # Validated: apply.
        entry = JournalEntry(
            kind=kind,
            reference=reference,
            description=description[:255],
            created_by=created_by,
            reverses=reverses,
        )
        self._entries.append(entry)
        if reference is not None:
            self._taken_references.add(reference)
        for leg in legs:
            account = accounts[leg.account_id]
            account.balance += leg.amount
            self._postings.append(
                Posting(
                    entry=entry,
                    account_id=leg.account_id,
                    amount=leg.amount,
                    balance_after=account.balance,
                )
            )
            self._touch(account)
        if hold is not None:
            accounts[hold.account_id].held -= hold.amount
            hold.status = HoldStatus.CAPTURED
            hold.entry = entry
            hold.resolved_at = self._now
            self._changed_holds[hold.pk] = hold
        return entry

    def transfer(
        self,
        *,
        from_account_id: int,
        to_account_id: int,
        amount: int,
        kind: str = EntryKind.TRANSFER,
        reference: str | None = None,
        description: str = "",
        hold_id: int | None = None,
    ) -> JournalEntry:
        if from_account_id == to_account_id:
            raise SameAccount("Source and destination accounts must differ.")
        if not isinstance(amount, int) or isinstance(amount, bool) or amount < 1:
            raise InvalidAmount("Amount must be a positive integer.", amount=amount)
        return self.post_entry(
            kind=kind,
            legs=[Leg(from_account_id, -amount), Leg(to_account_id, amount)],
            reference=reference,
            description=description,
            hold_id=hold_id,
        )

    def place_hold(self, *, account_id: int, amount: int, reference: str = "") -> Hold:
        """Reserve ``amount`` of the account's available funds (saved on flush)."""
        if not isinstance(amount, int) or isinstance(amount, bool) or amount < 1:
            raise InvalidAmount("Amount must be a positive integer.", amount=amount)
        account = self.account(account_id)
        self._check_usable(account, allow_frozen=False)
        if not account.allow_negative and account.available < amount:
            raise InsufficientFunds(
                f"Account {account_id} has {account.available} available; {amount} needed.",
                account_id=account_id,
                available=account.available,
                required=amount,
            )
        account.held += amount
        self._touch(account)
        hold = Hold(account_id=account_id, amount=amount, reference=reference[:128])
        self._new_holds.append(hold)
        return hold

    def release_hold(self, *, hold_id: int) -> Hold:
        """Return a hold's funds to the account's available balance."""
        hold = self._hold(hold_id)
        account = self.account(hold.account_id)
        account.held -= hold.amount
        self._touch(account)
        hold.status = HoldStatus.RELEASED
        hold.resolved_at = self._now
        self._changed_holds[hold.pk] = hold
        return hold

    def flush(self) -> None:
        """Write all applied operations with bulk statements (with
        ``lock_accounts_last``: all but postings and balances, which
        :meth:`flush_balances` writes)."""
        if self._entries:
            bulk_insert_rows(self._entries)
        if self._new_holds:
            bulk_insert_rows(self._new_holds)
        if self._changed_holds:
            bulk_update_rows(list(self._changed_holds.values()), ["status", "entry", "resolved_at"])
        self._entries, self._new_holds, self._changed_holds = [], [], {}
        if not self._lock_last:
            self._write_balances()

    def flush_balances(self) -> None:
        """``lock_accounts_last``: lock the changed accounts, carry the batch's
        changes onto them, write postings and balances. Call it after
        :meth:`flush`, as the transaction's last writes. Raises
        ``StaleAccounts`` (nothing written by it) when a locked row no longer
        satisfies what an operation was checked against."""
        if not self._lock_last or not self._changed_accounts:
            return
        if connection.vendor == "postgresql":
            self._apply_balances_locked()
            return
        locked = lock_accounts(self._changed_accounts)
        for aid in sorted(self._changed_accounts):
            mine, now = self.accounts[aid], locked[aid]
            d_balance, d_held, d_version = self._changes(aid)
            if now.status != mine.status or now.allow_negative != mine.allow_negative:
                raise StaleAccounts(f"Account {aid} changed status while the batch ran.")
            available = now.balance + d_balance - (now.held + d_held)
            if d_balance - d_held < 0 and not now.allow_negative and available < 0:
                raise StaleAccounts(f"Account {aid} no longer has the funds the batch used.")
            mine.balance, mine.held = now.balance + d_balance, now.held + d_held
            mine.version = now.version + d_version
        self._number_postings({aid: locked[aid].balance for aid in self._changed_accounts})
        self._write_balances()

    def _changes(self, aid: int) -> tuple[int, int, int]:
        """What the batch did to an account since it read it: balance, held, version."""
        mine, (balance0, held0, version0) = self.accounts[aid], self._read[aid]
        return mine.balance - balance0, mine.held - held0, mine.version - version0

    def _number_postings(self, balances_before: dict[int, int]) -> None:
        """Each posting's ``balance_after``, counted on from its account's locked balance."""
        running = dict(balances_before)
        for posting in self._postings:
            running[posting.account_id] += posting.amount
            posting.balance_after = running[posting.account_id]

    def _apply_balances_locked(self) -> None:
        """``flush_balances`` on PostgreSQL: lock the changed accounts
        (``_LOCK_ACCOUNTS_SQL``), then check and update them in one statement
        (``_APPLY_BALANCES_SQL``; one account: ``_APPLY_ONE_BALANCE_SQL``
        first), then insert the postings with their ``balance_after``.

        The two statements go in one round trip (a pipeline) instead of a
        locking read of whole rows and an UPDATE: the same locks in the same
        order, the same checks against the locked rows, the same
        ``StaleAccounts`` — and when one account fails a check, no account is
        written. Two statements, not one: see ``_LOCK_ACCOUNTS_SQL``. (One
        account whose check fails takes a second round trip, the CTE's.)"""
        ids = sorted(self._changed_accounts)
        d_balance, d_held, d_version = zip(*(self._changes(aid) for aid in ids), strict=True)
        mine = [self.accounts[aid] for aid in ids]
        rows = {}
        with binary_cursor() as cursor, pipelined():
            cursor.execute(_LOCK_ACCOUNTS_SQL, [ids])
            if len(ids) == 1:  # a schedule's hold, a cancel's release
                (a,) = mine
                db, dh = d_balance[0], d_held[0]
                cursor.execute(
                    _APPLY_ONE_BALANCE_SQL,
                    [
                        *(db, dh, d_version[0], self._now),  # SET
                        *(a.pk, a.status, a.allow_negative, db, dh, db, dh),  # WHERE
                        db,  # RETURNING
                    ],
                )
                rows = {row[0]: (True, True, *row[1:]) for row in cursor.fetchall()}
            if not rows:  # several accounts, or the one failed a check: which?
                cursor.execute(
                    _APPLY_BALANCES_SQL,
                    [
                        ids,
                        list(d_balance),
                        list(d_held),
                        list(d_version),
                        [a.status for a in mine],
                        [a.allow_negative for a in mine],
                        self._now,
                    ],
                )
                rows = {row[0]: row[1:] for row in cursor.fetchall()}
        for aid in ids:  # the first account, by id, that failed a check
            if aid not in rows:
                raise StaleAccounts(f"Account {aid} no longer exists.")
            same_status, funded = rows[aid][:2]
            if not same_status:
                raise StaleAccounts(f"Account {aid} changed status while the batch ran.")
            if not funded:
                raise StaleAccounts(f"Account {aid} no longer has the funds the batch used.")
        balances_before: dict[int, int] = {}
        for aid in ids:
            balance_before, balance, held, version = rows[aid][2:]
            if balance is None:  # every check passed, yet not written: never pass silently
                raise StaleAccounts(f"Account {aid} was not written.")
            account = self.accounts[aid]
            account.balance, account.held, account.version = balance, held, version
            balances_before[aid] = balance_before
        self._number_postings(balances_before)
        self._write_postings()
        self._changed_accounts = set()

    def _write_postings(self) -> None:
        if self._postings:
            bulk_insert_rows(self._postings, read_back=False)
        self._postings = []

    def _write_balances(self) -> None:
        self._write_postings()
        if self._changed_accounts:
            bulk_update_rows(
                [self.accounts[aid] for aid in sorted(self._changed_accounts)],
                ["balance", "held", "version", "updated_at"],
            )
        self._changed_accounts = set()


# flush_balances on PostgreSQL, first statement: the row locks, in ascending id
# order (as ``lock_accounts``: concurrent batches wait instead of deadlocking).
# A statement of its own so that the next one's snapshot, taken after these
# locks, sees the version of each row this transaction locked. When lock and
# UPDATE were one statement (until session 13), the UPDATE worked from the
# statement's snapshot: for a row updated by a transaction that committed
# after that snapshot and before the lock, it started from the old version.
# If that version's xmax was a multixact with a live key-share member (another
# transaction's foreign-key check), PostgreSQL counted it as still being
# modified and took the old version's tuple lock before moving on to the new
# one — a lock that a third transaction, queued on that version and waiting
# for this one's lock on the new version, already held: ``deadlock detected``
# (once in ~400,000 payments in a capacity run, a schedule request answered
# 503; in 3 runs of 4 of tests/payments/engine/test_lock_contention.py).
_LOCK_ACCOUNTS_SQL = """
SELECT id FROM ledger_account WHERE id = ANY(%b::bigint[]) ORDER BY id FOR NO KEY UPDATE
"""

# flush_balances on PostgreSQL, second statement. ``locked`` reads the rows
# the first statement locked (its lock clause finds them locked by this
# transaction already, and keeps the statement safe on its own) — the latest
# committed versions;
# ``checked`` re-checks what the batch's operations relied on against them
# (status and overdraft rule unchanged; funds, where the batch lowers them);
# ``applied`` adds the batch's changes to the locked rows only if every account
# passed and none has gone — else nothing is written and the caller raises
# ``StaleAccounts``.
# Each output row: the account, its two checks, its balance before and its
# balance, held and version after (NULL when nothing was written).
_APPLY_BALANCES_SQL = """
WITH d AS (
    SELECT * FROM unnest(%b::bigint[], %b::bigint[], %b::bigint[], %b::bigint[],
                         %b::text[], %b::boolean[])
        AS d(id, d_balance, d_held, d_version, status, allow_negative)
), locked AS MATERIALIZED (
    SELECT a.id, a.balance, a.held, a.status, a.allow_negative
      FROM ledger_account a
     WHERE a.id IN (SELECT id FROM d)
     ORDER BY a.id
       FOR NO KEY UPDATE
), checked AS MATERIALIZED (
    SELECT l.id,
           l.status = d.status AND l.allow_negative = d.allow_negative AS same_status,
           d.d_balance - d.d_held >= 0 OR l.allow_negative
               OR l.balance + d.d_balance - (l.held + d.d_held) >= 0 AS funded
      FROM locked l JOIN d USING (id)
), applied AS (
    UPDATE ledger_account a
       SET balance = a.balance + d.d_balance,
           held = a.held + d.d_held,
           version = a.version + d.d_version,
           updated_at = %b
      FROM d
     WHERE a.id = d.id
       AND a.id IN (SELECT id FROM locked)
       AND NOT EXISTS (SELECT 1 FROM checked WHERE NOT (same_status AND funded))
       AND (SELECT count(*) FROM checked) = (SELECT count(*) FROM d)
 RETURNING a.id, a.balance - d.d_balance AS balance_before, a.balance, a.held, a.version
)
SELECT c.id, c.same_status, c.funded, p.balance_before, p.balance, p.held, p.version
  FROM checked c LEFT JOIN applied p USING (id)
"""

# flush_balances on PostgreSQL, second statement when the batch changed one
# account: ``_APPLY_BALANCES_SQL``'s checks and update for that row alone, as
# a plain UPDATE by primary key. PostgreSQL spent 0.53 ms of CPU on the CTE
# for a schedule's hold (a quarter planning it; bench/results/…-s21-insert/).
# The row is locked by the first statement, so when no row comes back (a
# check failed, or it is gone) the CTE runs next, writes nothing either and
# says which check failed.
_APPLY_ONE_BALANCE_SQL = """
UPDATE ledger_account a
   SET balance = a.balance + %b::bigint,
       held = a.held + %b::bigint,
       version = a.version + %b::bigint,
       updated_at = %b
 WHERE a.id = %b::bigint
   AND a.status = %b::text AND a.allow_negative = %b::boolean
   AND (%b::bigint - %b::bigint >= 0 OR a.allow_negative
        OR a.balance + %b::bigint - (a.held + %b::bigint) >= 0)
RETURNING a.id, a.balance - %b::bigint, a.balance, a.held, a.version
"""


def _unique_reference_violation(exc: IntegrityError) -> bool:
    return "reference" in str(exc)


# --- single-operation services ---------------------------------------------


def issuance_account() -> Account:
    """The system account money is issued from (may go negative)."""
    account, _ = Account.objects.get_or_create(
        system_code=Account.ISSUANCE,
        defaults={"name": "Issuance", "allow_negative": True},
    )
    return account


def account_create(
    *,
    owner: AbstractBaseUser | None,
    name: str = "",
    max_payment_amount: int | None = None,
) -> Account:
    fields: dict[str, object] = {"owner": owner, "name": name}
    if max_payment_amount is not None:
        fields["max_payment_amount"] = max_payment_amount
    return Account.objects.create(**fields)


def transfer_post(
    *,
    from_account_id: int,
    to_account_id: int,
    amount: int,
    reference: str | None = None,
    description: str = "",
    hold_id: int | None = None,
    kind: str = EntryKind.TRANSFER,
) -> JournalEntry:
    """Move ``amount`` between two accounts in one balanced entry.

    With ``hold_id`` the transfer captures that hold (capture-with-transfer).
    Raises :class:`DuplicateReference` if ``reference`` was posted before,
    including by a concurrent transaction that committed first.
    """
    try:
        with transaction.atomic():
            batch = LedgerBatch(
                account_ids=[from_account_id, to_account_id],
                hold_ids=[hold_id] if hold_id else [],
                references=[reference] if reference else [],
            )
            entry = batch.transfer(
                from_account_id=from_account_id,
                to_account_id=to_account_id,
                amount=amount,
                kind=kind,
                reference=reference,
                description=description,
                hold_id=hold_id,
            )
            batch.flush()
    except IntegrityError as exc:
        if reference and _unique_reference_violation(exc):
            raise DuplicateReference(
                f"An entry with reference {reference!r} is already posted.", reference=reference
            ) from exc
        raise
    return entry


def deposit(
    *, account_id: int, amount: int, reference: str | None = None, description: str = ""
) -> JournalEntry:
    """Issue new money into an account (debits the issuance account)."""
    return transfer_post(
        from_account_id=issuance_account().pk,
        to_account_id=account_id,
        amount=amount,
        reference=reference,
        description=description or "Deposit",
        kind=EntryKind.DEPOSIT,
    )


def hold_place(*, account_id: int, amount: int, reference: str = "") -> Hold:
    with transaction.atomic():
        batch = LedgerBatch(account_ids=[account_id])
        hold = batch.place_hold(account_id=account_id, amount=amount, reference=reference)
        batch.flush()
    return hold


def hold_release(*, hold_id: int) -> Hold:
    with transaction.atomic():
        account_id = Hold.objects.filter(pk=hold_id).values_list("account_id", flat=True).first()
        if account_id is None:
            raise HoldNotActive(f"Hold {hold_id} does not exist.", hold_id=hold_id)
        batch = LedgerBatch(account_ids=[account_id], hold_ids=[hold_id])
        hold = batch.release_hold(hold_id=hold_id)
        batch.flush()
    return hold


def hold_capture(
    *, hold_id: int, to_account_id: int, reference: str | None = None, description: str = ""
) -> JournalEntry:
    """Transfer a hold's amount from its account to ``to_account_id``."""
    hold = Hold.objects.filter(pk=hold_id).only("account_id", "amount").first()
    if hold is None:
        raise HoldNotActive(f"Hold {hold_id} does not exist.", hold_id=hold_id)
    return transfer_post(
        from_account_id=hold.account_id,
        to_account_id=to_account_id,
        amount=hold.amount,
        reference=reference,
        description=description,
        hold_id=hold_id,
    )


def adjustment_post(
    *, account_id: int, amount: int, description: str, staff_user: AbstractBaseUser
) -> JournalEntry:
    """A staff balance adjustment: a balanced entry against the issuance account.

    Positive ``amount`` credits the account, negative debits it. Frozen accounts
    may be adjusted (that is often why they are frozen); closed ones may not.
    The caller checks the staff user's permission.
    """
    if not isinstance(amount, int) or isinstance(amount, bool) or amount == 0:
        raise InvalidAmount("Adjustment amount must be a non-zero integer.", amount=amount)
    if not description.strip():
        raise InvalidAmount("An adjustment needs a reason.")
    issuance_id = issuance_account().pk
    if Account.objects.filter(pk=account_id, system_code__isnull=False).exists():
        # the issuance account against itself would be a no-op entry in the audit trail
        raise SystemAccountProtected(
            f"Account {account_id} is a system account; it cannot be adjusted.",
            account_id=account_id,
        )
    with transaction.atomic():
        batch = LedgerBatch(account_ids=[account_id, issuance_id])
        entry = batch.post_entry(
            kind=EntryKind.ADJUSTMENT,
            legs=[Leg(issuance_id, -amount), Leg(account_id, amount)],
            description=description,
            created_by=staff_user,
            allow_frozen=True,
        )
        batch.flush()
    return entry


def entry_reverse(
    *, entry_id: int, description: str = "", staff_user: AbstractBaseUser | None = None
) -> JournalEntry:
    """Post an entry that exactly negates ``entry_id``; the original stays untouched."""
    with transaction.atomic():
        original = JournalEntry.objects.select_for_update(no_key=True).get(pk=entry_id)
        if JournalEntry.objects.filter(reverses=original).exists():
            raise EntryAlreadyReversed(f"Entry {entry_id} is already reversed.", entry_id=entry_id)
        legs = [Leg(p.account_id, -p.amount) for p in original.postings.order_by("pk")]
        batch = LedgerBatch(account_ids=[leg.account_id for leg in legs])
        entry = batch.post_entry(
            kind=EntryKind.REVERSAL,
            legs=legs,
            description=description or f"Reversal of entry {entry_id}",
            created_by=staff_user,
            reverses=original,
            allow_frozen=True,
        )
        batch.flush()
    return entry


def account_set_status(*, account_id: int, status: str) -> Account:
    """Freeze, unfreeze or close a client account. Closing needs zero balance and no holds.

    System accounts (``system_code`` set) are refused with
    ``SystemAccountProtected``: a frozen issuance account stops every deposit
    (``create_api_client`` among them) and adjustment. The CHECK constraint
    ``ledger_account_system_active`` backs this in the database.
    """
    if status not in AccountStatus.values:
        raise LedgerError(f"Unknown account status {status!r}.")
    with transaction.atomic():
        account = lock_accounts([account_id]).get(account_id)
        if account is None:
            raise AccountNotFound(f"Account {account_id} does not exist.", account_id=account_id)
        if account.system_code is not None:
            raise SystemAccountProtected(
                f"Account {account} is a system account; its status cannot be changed.",
                account_id=account_id,
            )
        if account.status == AccountStatus.CLOSED and status != AccountStatus.CLOSED:
            raise AccountNotActive(f"Account {account_id} is closed.", account_id=account_id)
        if status == AccountStatus.CLOSED and (account.balance != 0 or account.held != 0):
            raise LedgerError(
                f"Account {account_id} must have zero balance and no holds to close.",
                account_id=account_id,
            )
        account.status = status
        account.version += 1
        account.updated_at = timezone.now()
        account.save(update_fields=["status", "version", "updated_at"])
    return account
