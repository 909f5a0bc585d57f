"""Migration 0017 (fewer payment indexes), both ways, on the suite's database.

On PostgreSQL it runs its own statements (build the new indexes, drop the old,
leave the foreign keys alone) instead of Django's operations: the schema it
leaves must be the one the model state describes, and undoing it must give
0016's back.
"""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from tests.payments.helpers import constraints, foreign_keys, migrate

BEFORE = [("payments", "0016_fewer_index_writes")]
OLD = {"payments_status_due", "payments_payment_hold_id_e284f613"}
NEW = {"payments_one_per_entry", "payments_unfinished_status_due"}


def unique_on_entry(schema: dict) -> set:
    return {
        name
        for name, (columns, unique, _, foreign_key) in schema.items()
        if columns == ("journal_entry_id",) and unique and not foreign_key
    }


@pytest.mark.django_db(transaction=True)
def test_0017_both_ways_gives_the_schema_of_each_side():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    after = constraints("payments_payment")
    assert set(after) >= NEW and not OLD & set(after)
    try:
        migrate(BEFORE)
        before = constraints("payments_payment")
        assert not NEW & set(before)
        assert len(unique_on_entry(before)) == 1  # the OneToOne's full unique index
        if connection.vendor == "postgresql":
            assert set(before) >= OLD | {"payments_payment_to_account_id_0eca85ab"}
        assert foreign_keys(before) == foreign_keys(after)  # untouched either way
    finally:
        migrate(latest)
    assert constraints("payments_payment") == after
