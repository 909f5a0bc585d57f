"""The bulk writers of ``ledger.db`` on PostgreSQL: what comes back on the objects,
and what the rows hold (the executor and the ledger flush write through them)."""

from datetime import timedelta

import pytest
from django.db import DataError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.db import bulk_insert_rows, bulk_update_rows, write_rows
from ledger.models import EntryKind, JournalEntry, Posting
from payments.models import IdempotencyKey, IdempotencyStatus, Payment, PaymentEvent
from tests.factories import AccountFactory, UserFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def entry(reference, **fields):
    return JournalEntry(kind=EntryKind.TRANSFER, reference=reference, **fields)


@pytest.fixture(autouse=True)
def balanced():
    """Give every entry a test writes two postings (the balance check runs at the
    test's end), with the same writer."""
    yield
    a, b = AccountFactory(), AccountFactory()
    bare = JournalEntry.objects.filter(postings__isnull=True)
    bulk_insert_rows(
        [
            Posting(entry=e, account=account, amount=amount, balance_after=0)
            for e in bare
            for account, amount in ((a, -1), (b, 1))
        ],
        read_back=False,
    )


@pytest.mark.parametrize("n", [1, 3])
def test_new_rows_come_back_saved_with_their_ids_and_database_defaults(n):
    entries = [entry(f"db:{i}") for i in range(n)]
    bulk_insert_rows(entries)
    stored = dict(
        JournalEntry.objects.filter(reference__startswith="db:").values_list("pk", "created_at")
    )
    assert {e.pk: e.created_at for e in entries} == stored
    assert None not in stored.values()
    assert [(e._state.adding, e._state.db) for e in entries] == [(False, "default")] * n


def test_a_batch_mixing_defaults_and_given_values_keeps_both():
    """Where some objects leave a database default and others give the value,
    each row gets its own (Django's bulk_create path)."""
    when = timezone.now() - timedelta(days=1)
    bulk_insert_rows([entry("mix:given", created_at=when), entry("mix:default")])
    stored = dict(
        JournalEntry.objects.filter(reference__startswith="mix:").values_list(
            "reference", "created_at"
        )
    )
    assert stored["mix:given"] == when
    assert stored["mix:default"] > when


def test_a_json_none_is_stored_as_sql_null():
    now = timezone.now()
    key = IdempotencyKey(
        client=UserFactory(),
        key="k",
        fingerprint="f",
        status=IdempotencyStatus.IN_FLIGHT,
        response_body=None,
        locked_at=now,
        created_at=now,
    )
    bulk_insert_rows([key], read_back=False)
    assert IdempotencyKey.objects.filter(response_body__isnull=True).count() == 1


@pytest.mark.parametrize("read_back", [True, False])
def test_ids_given_for_an_auto_id_are_kept(read_back):
    """Only objects that lack an id get one from the sequence; given ones are
    written as given (as Django's bulk_create does)."""
    last = JournalEntry.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    given = [entry(f"given:{i}", pk=last + 1000 + i) for i in range(2)]
    bulk_insert_rows(given, read_back=read_back)
    stored = JournalEntry.objects.filter(reference__startswith="given:")
    assert sorted(stored.values_list("pk", flat=True)) == [last + 1000, last + 1001]
    assert [e.pk for e in given] == [last + 1000, last + 1001]


def test_a_related_object_saved_after_assignment_is_written_and_set_by_its_id():
    """``Posting(entry=e)`` built while ``e`` had no id yet (the executor builds
    postings before their entries are inserted): the row gets the id, and so
    does the object's ``entry_id``."""
    entries = [entry(f"rel:{i}") for i in range(2)]
    a, b = AccountFactory(), AccountFactory()
    postings = [
        Posting(entry=e, account=account, amount=amount, balance_after=0)
        for e in entries
        for account, amount in ((a, -1), (b, 1))
    ]
    assert {p.entry_id for p in postings} == {None}
    bulk_insert_rows(entries)
    bulk_insert_rows(postings, read_back=False)
    assert [p.entry_id for p in postings] == [entries[0].pk] * 2 + [entries[1].pk] * 2
    stored = Posting.objects.filter(entry__in=entries).values_list("entry_id", "amount")
    assert sorted(stored) == sorted((p.entry_id, p.amount) for p in postings)


def payment_rows(n, owner, source, target, due, **fields):
    return [
        Payment(
            from_account=source,
            to_account=target,
            owner=owner,
            amount=1234,
            description="café ☕",
            metadata={"order": [1, "二"], "none": None},
            due_at=due,
            run_at=due - timedelta(seconds=1),
            partition=7,
            lease_expires_at=None,
            **fields,
        )
        for _ in range(n)
    ]


@pytest.mark.parametrize("read_back", [True, False])
def test_one_row_is_stored_as_several_are(read_back):
    """A single object goes out as bound values, several as arrays: the stored
    rows are the same, column for column (JSON, text, nulls, small ints, times)."""
    owner = UserFactory()
    source, target = AccountFactory(owner=owner), AccountFactory()
    due = timezone.now() + timedelta(hours=1)
    alone = payment_rows(1, owner, source, target, due, error_code="x")
    together = payment_rows(2, owner, source, target, due, error_code="x")
    with CaptureQueriesContext(connection) as one:
        bulk_insert_rows(alone, read_back=read_back)
    with CaptureQueriesContext(connection) as several:
        bulk_insert_rows(together, read_back=read_back)
    assert " VALUES (" in one[-1]["sql"] and "unnest(" not in one[-1]["sql"]
    assert "unnest(" in several[-1]["sql"]
    stamped = {"id", "created_at", "updated_at"}  # each object's own
    columns = [f.attname for f in Payment._meta.concrete_fields if f.attname not in stamped]
    stored = [
        {c: getattr(p, c) for c in columns}
        for p in Payment.objects.filter(pk__in=[p.pk for p in alone + together])
    ]
    assert len(stored) == 3
    assert stored[0] == stored[1] == stored[2]
    assert stored[0] == {
        "from_account_id": source.pk,
        "to_account_id": target.pk,
        "owner_id": owner.pk,
        "amount": 1234,
        "description": "café ☕",
        "metadata": {"order": [1, "二"], "none": None},
        "status": "PENDING",
        "due_at": due,
        "run_at": due - timedelta(seconds=1),
        "partition": 7,
        "fence": 0,
        "lease_expires_at": None,
        "attempts": 0,
        "hold_id": None,
        "journal_entry_id": None,
        "error_code": "x",
        "error_message": "",
        "recurring_id": None,
        "executed_at": None,
        "cancelled_at": None,
    }
    if read_back:  # the database's defaults come back on the objects
        rows = Payment.objects.filter(pk__in=[p.pk for p in alone + together])
        assert {p.pk: p.created_at for p in alone + together} == {p.pk: p.created_at for p in rows}


def test_one_row_with_an_auto_id_comes_back_with_the_id_the_insert_gave_it():
    (e,) = entries = [entry("one:auto")]
    with CaptureQueriesContext(connection) as ctx:
        bulk_insert_rows(entries)
    assert len(ctx) == 1 and " VALUES (" in ctx[0]["sql"]
    assert JournalEntry.objects.get(reference="one:auto").pk == e.pk is not None


def test_several_rows_with_a_unique_text_take_their_ids_from_the_insert(monkeypatch):
    """Journal entries, each with its own reference: one statement, no sequence
    round trip; each object gets its own row's id and defaults, matched by the
    reference, whatever order RETURNING gives the rows in."""
    from ledger import db

    insert = db._insert
    monkeypatch.setattr(db, "_insert", lambda *a, **kw: list(reversed(insert(*a, **kw))))
    entries = [entry(f"ret:{i}", description=f"d{i}") for i in range(3)]
    with CaptureQueriesContext(connection) as ctx:
        bulk_insert_rows(entries)
    assert len(ctx) == 1 and "RETURNING" in ctx[0]["sql"] and "nextval" not in ctx[0]["sql"]
    stored = {
        e.reference: (e.pk, e.created_at, e.description)
        for e in JournalEntry.objects.filter(reference__startswith="ret:")
    }
    assert {e.reference: (e.pk, e.created_at, e.description) for e in entries} == stored
    assert len({e.pk for e in entries}) == 3 and None not in {e.pk for e in entries}
    assert [(e._state.adding, e._state.db) for e in entries] == [(False, "default")] * 3


def test_one_row_without_a_reference_takes_its_id_from_the_insert():
    """One row: any text value tells it apart (its ``kind``), so RETURNING gives
    its id back without a sequence round trip first."""
    e = entry(None)
    with CaptureQueriesContext(connection) as ctx:
        bulk_insert_rows([e])
    assert len(ctx) == 1 and " VALUES (" in ctx[0]["sql"] and "nextval" not in ctx[0]["sql"]
    stored = JournalEntry.objects.get(pk=e.pk)
    assert stored.reference is None and stored.created_at == e.created_at is not None


@pytest.mark.parametrize(
    "references",
    [["seq:a", None, "seq:b"], [101, 102], ["seq:a", "seq:b", "seq:a"]],
    ids=["none", "not-text", "twice"],
)
def test_rows_no_text_tells_apart_take_their_ids_from_the_sequence_first(references):
    """A missing, repeated or non-text reference cannot tell RETURNING's rows
    apart (a number is stored as text and would come back as another value):
    the ids come from the sequence first (two statements), and the objects
    come back saved; a repeated one is then refused by the UNIQUE constraint,
    as ever."""
    from django.db import IntegrityError

    entries = [entry(r) for r in references]
    repeated = len(set(references)) < len(references)
    with CaptureQueriesContext(connection) as ctx:
        if repeated:
            with pytest.raises(IntegrityError), transaction.atomic():
                bulk_insert_rows(entries)
        else:
            bulk_insert_rows(entries)
    sent = [q["sql"] for q in ctx.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert "nextval" in sent[0] and len(sent) == 2
    if not repeated:
        stored = dict(
            JournalEntry.objects.filter(pk__in=[e.pk for e in entries]).values_list(
                "pk", "created_at"
            )
        )
        assert {e.pk: e.created_at for e in entries} == stored and None not in stored.values()
        assert [(e._state.adding, e._state.db) for e in entries] == [(False, "default")] * len(
            entries
        )


@pytest.mark.parametrize("n", [1, 3])
def test_an_over_long_text_is_refused_not_cut_short(n):
    """A value longer than its column (``JournalEntry.reference``: 128, unique)
    is a DataError as ``save()`` raises, for an INSERT and an UPDATE, never
    silently shortened: two references that differ after 128 characters would
    otherwise both be stored as one."""
    entries = [entry(f"long:{i}:" + "x" * 200) for i in range(n)]
    with pytest.raises(DataError, match="too long"), transaction.atomic():
        bulk_insert_rows(entries)
    assert not JournalEntry.objects.filter(reference__startswith="long:").exists()
    stored = [entry(f"short:{i}") for i in range(n)]
    bulk_insert_rows(stored)
    for e in stored:
        e.reference += "y" * 200
    with pytest.raises(DataError, match="too long"), transaction.atomic():
        bulk_update_rows(stored, ["reference"])
    assert JournalEntry.objects.filter(reference__startswith="short:").count() == n


def stored_payments(payments):
    columns = [f.attname for f in Payment._meta.concrete_fields if f.attname != "updated_at"]
    rows = Payment.objects.filter(pk__in=[p.pk for p in payments]).order_by("pk")
    return [tuple(getattr(p, c) for c in columns) for p in rows]


@pytest.mark.parametrize("n", [1, 3])
def test_writes_sent_together_leave_the_rows_separate_writes_do(n):
    """``write_rows``: updates and inserts of several tables in one statement,
    each row as ``bulk_update_rows``/``bulk_insert_rows(read_back=False)``
    would leave it (one row: bound values; several: arrays)."""
    owner = UserFactory()
    source, target = AccountFactory(owner=owner), AccountFactory()
    due = timezone.now() + timedelta(hours=1)
    together, apart = (payment_rows(n, owner, source, target, due) for _ in range(2))
    bulk_insert_rows(together + apart)
    for p in together + apart:
        p.status, p.error_code, p.fence = "FAILED", "gone", p.fence + 1

    def events(payments, tag):
        return [
            PaymentEvent(
                payment=p,
                type="executed",
                from_status="QUEUED",
                to_status="FAILED",
                actor=tag,
                data={"n": i},
            )
            for i, p in enumerate(payments)
        ]

    with CaptureQueriesContext(connection) as one:
        write_rows(
            updates=[(together, ["status", "error_code", "fence"])],
            inserts=[events(together, "together"), [entry(f"w:{i}") for i in range(n)]],
        )
    assert len(one) == 1 and one[0]["sql"].startswith("WITH w0 AS (UPDATE")
    bulk_update_rows(apart, ["status", "error_code", "fence"])
    bulk_insert_rows(events(apart, "apart"), read_back=False)
    assert [row[1:] for row in stored_payments(together)] == [
        row[1:] for row in stored_payments(apart)
    ]
    assert {p.status for p in Payment.objects.filter(pk__in=[p.pk for p in together])} == {"FAILED"}

    def written(tag):
        rows = PaymentEvent.objects.filter(actor=tag).values_list("to_status", "data", "type")
        return sorted(rows, key=lambda row: row[1]["n"])

    assert written("together") == written("apart") != []
    assert JournalEntry.objects.filter(reference__startswith="w:").count() == n


def test_writes_sent_together_hand_a_batch_mixing_defaults_to_bulk_create():
    """An insert whose objects disagree on a database default goes out on its own
    (Django's bulk_create keeps each row's), the rest still together."""
    when = timezone.now() - timedelta(days=1)
    with CaptureQueriesContext(connection) as ctx:
        write_rows(
            inserts=[
                [entry("wmix:given", created_at=when), entry("wmix:default")],
                [entry("wmix:a"), entry("wmix:b")],
            ]
        )
    assert len(ctx) == 2
    stored = dict(
        JournalEntry.objects.filter(reference__startswith="wmix:").values_list(
            "reference", "created_at"
        )
    )
    assert stored["wmix:given"] == when
    assert stored["wmix:default"] > when
    assert stored.keys() == {"wmix:given", "wmix:default", "wmix:a", "wmix:b"}


def test_writes_sent_together_send_nothing_for_nothing():
    with CaptureQueriesContext(connection) as ctx:
        write_rows(updates=[([], ["status"])], inserts=[[], []])
    assert len(ctx) == 0
    with CaptureQueriesContext(connection) as ctx:
        write_rows(inserts=[[], [entry("wone:0")]])
    assert len(ctx) == 1 and ctx[0]["sql"].startswith("INSERT")
