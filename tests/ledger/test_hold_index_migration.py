"""Ledger 0006 (a hold's keys unindexed), both ways, on the suite's database.

It drops the two indexes by name instead of Django's AlterField (which would
drop and re-add both foreign keys, re-checking every hold): the schema it
leaves must be the one the model state describes — the partial index of active
holds kept, both foreign keys untouched — and undoing it must give 0005's
back, on PostgreSQL and SQLite alike.
"""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from tests.payments.helpers import constraints, foreign_keys, migrate

BEFORE = [("ledger", "0005_fewer_index_writes")]
DROPPED = {"ledger_hold_account_id_96c93480", "ledger_hold_entry_id_c3c6492f"}


def indexed_columns(schema: dict) -> set:
    return {
        columns for columns, _, index, foreign_key in schema.values() if index and not foreign_key
    }


@pytest.mark.django_db(transaction=True)
def test_0006_both_ways_gives_the_schema_of_each_side():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    after = constraints("ledger_hold")
    assert not DROPPED & set(after)
    assert "ledger_hold_active_by_account" in after
    assert ("entry_id",) not in indexed_columns(after)
    try:
        migrate(BEFORE)
        before = constraints("ledger_hold")
        assert set(before) >= DROPPED
        assert {before[name][0] for name in DROPPED} == {("account_id",), ("entry_id",)}
        assert foreign_keys(before) == foreign_keys(after)  # untouched either way
    finally:
        migrate(latest)
    assert constraints("ledger_hold") == after
