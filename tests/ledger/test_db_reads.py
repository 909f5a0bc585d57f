"""``ledger.db``'s hot-path reads and pipeline on PostgreSQL: rows built into model
instances as the ORM builds them (``instances``), binary rows, and ``pipelined``
— what the executor and ``LedgerBatch`` rely on."""

import pytest
from django.db import IntegrityError, connection, transaction

from ledger.db import binary_cursor, instances, pipelined, select_list
from ledger.models import Account, Hold, JournalEntry
from ledger.services import BATCH_ACCOUNT_FIELDS, hold_place
from payments.models import Payment
from tests.factories import AccountFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

ACCOUNT_COLUMNS = {f.attname for f in Account._meta.concrete_fields}
HOLD_COLUMNS = {f.attname for f in Hold._meta.concrete_fields}


def read(model, columns, ids, *, binary):
    sql = f"SELECT {select_list(model, columns)} FROM {model._meta.db_table} WHERE id = ANY(%b)"
    with binary_cursor(binary_results=binary) as cursor:
        cursor.execute(sql + " ORDER BY id", [ids])
        return instances(model, columns, cursor.fetchall())


def state(obj):
    """Every loaded field, the deferred ones, and the ORM's bookkeeping."""
    loaded = {
        f.attname: getattr(obj, f.attname)
        for f in obj._meta.concrete_fields
        if f.attname not in obj.get_deferred_fields()
    }
    return loaded, obj.get_deferred_fields(), obj._state.adding, obj._state.db


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
@pytest.mark.parametrize(
    "model,columns",
    [(Account, ACCOUNT_COLUMNS), (Account, set(BATCH_ACCOUNT_FIELDS)), (Hold, HOLD_COLUMNS)],
    ids=["account", "account-batch-fields", "hold"],
)
def test_rows_become_the_instances_the_orm_builds(model, columns, binary):
    a, b = AccountFactory(funded=50), AccountFactory(funded=10)
    hold_place(account_id=a.pk, amount=20)
    hold_place(account_id=b.pk, amount=5)
    ids = sorted(model.objects.values_list("pk", flat=True))
    orm = list(model.objects.filter(pk__in=ids).only(*columns).order_by("pk"))
    ours = read(model, columns, ids, binary=binary)
    assert [state(o) for o in ours] == [state(o) for o in orm]
    assert all(type(o) is model for o in ours)
    created = [o.created_at for o in ours if "created_at" in columns]
    assert all(t.tzinfo is not None and t.utcoffset().total_seconds() == 0 for t in created)


def test_a_payment_read_so_can_be_saved_like_an_orm_one():
    """What the executor does with its rows: change a field and write it back."""
    a = AccountFactory(funded=10)
    (held,) = read(Hold, HOLD_COLUMNS, [hold_place(account_id=a.pk, amount=3).pk], binary=True)
    held.reference = "changed"
    held.save(update_fields=["reference"])
    assert Hold.objects.get(pk=held.pk).reference == "changed"


def test_columns_are_read_in_the_models_order_whatever_order_they_are_named():
    assert select_list(Account, ["balance", "id"]) == select_list(Account, ["id", "balance"])
    assert select_list(Account, ["balance", "id"]).index("id") < select_list(
        Account, ["balance", "id"]
    ).index("balance")


@pytest.mark.parametrize(
    "model,columns,message",
    [
        (Payment, {"id", "metadata"}, "Payment.metadata needs a converter"),  # JSON
        (Account, {"id", "nope"}, "Account has no column ['nope']"),
        (Account, {"id", "owner"}, "Account has no column ['owner']"),  # a name, not the attname
    ],
)
def test_columns_that_cannot_be_read_so_are_refused(model, columns, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        select_list(model, columns)


def entries(*references):
    return list(
        JournalEntry.objects.filter(reference__in=references).values_list("reference", flat=True)
    )


def insert_entry(cursor, reference):
    cursor.execute(
        "INSERT INTO ledger_journalentry (kind, reference, description)"
        " VALUES ('transfer', %b, '')",
        [reference],
    )


def test_a_pipeline_sends_writes_with_the_next_read_and_nests_without_syncing(monkeypatch):
    connection.ensure_connection()
    opened = []
    original = connection.connection.pipeline

    def counted():
        opened.append(1)
        return original()

    monkeypatch.setattr(connection.connection, "pipeline", counted)
    with transaction.atomic():
        with pipelined():
            assert connection.connection.pgconn.pipeline_status
            with binary_cursor() as cursor:
                insert_entry(cursor, "pipe:1")
                with pipelined():  # nested: the same pipeline, no sync of its own
                    insert_entry(cursor, "pipe:2")
                    assert cursor.rowcount == -1  # why nothing in it may read a row count
                with binary_cursor() as reader:
                    reader.execute(
                        "SELECT count(*) FROM ledger_journalentry WHERE reference LIKE 'pipe:%%'"
                    )
                    assert reader.fetchone() == (2,)
        assert not connection.connection.pgconn.pipeline_status
        assert len(opened) == 1  # a pipeline of psycopg's own syncs as it opens and closes
        assert sorted(entries("pipe:1", "pipe:2")) == ["pipe:1", "pipe:2"]
        transaction.set_rollback(True)  # the entries have no postings


def test_an_error_in_a_pipeline_is_a_django_error_and_the_connection_goes_on():
    with transaction.atomic():
        with binary_cursor() as cursor:
            insert_entry(cursor, "pipe:taken")
        with (
            pytest.raises(IntegrityError),
            transaction.atomic(),
            pipelined(),
            binary_cursor() as cursor,
        ):
            insert_entry(cursor, "pipe:fine")
            insert_entry(cursor, "pipe:taken")  # UNIQUE reference
            insert_entry(cursor, "pipe:after")  # never runs
        # the block rolled back to its savepoint; the transaction and connection go on
        assert entries("pipe:fine", "pipe:taken", "pipe:after") == ["pipe:taken"]
        transaction.set_rollback(True)
    assert entries("pipe:taken") == []


def test_pipelined_is_nothing_outside_postgresql(monkeypatch):
    connection.ensure_connection()
    monkeypatch.setattr(connection, "vendor", "sqlite")
    with pipelined():
        assert not connection.connection.pgconn.pipeline_status
