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

from tests.payments.helpers import migrate

BEFORE = [("ledger", "0005_fewer_index_writes")]
DROPPED = {"ledger_hold_account_id_96c93480", "ledger_hold_entry_id_c3c6492f"}


def constraints() -> dict:
    """Every index and constraint of ledger_hold: name -> (columns, unique, index,
    foreign key target)."""
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, "ledger_hold")
    return {
        name: (tuple(c["columns"]), c["unique"], c["index"], c["foreign_key"])
        for name, c in found.items()
    }


def foreign_keys(schema: dict) -> set:
    return {(columns, foreign_key) for columns, _, _, foreign_key in schema.values() if foreign_key}


def indexed_columns(schema: dict) -> set:
    return {
        columns for columns, _, index, foreign_key in schema.values() if index and not foreign_key
    }


@pytest.mark.django_db(transaction=True)
def test_0006_both_ways_gives_the_schema_of_each_side():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    after = constraints()
    assert not DROPPED & set(after)
    assert "ledger_hold_active_by_account" in after
    assert ("entry_id",) not in indexed_columns(after)
    try:
        migrate(BEFORE)
        before = constraints()
        assert set(before) >= DROPPED
        assert {before[name][0] for name in DROPPED} == {("account_id",), ("entry_id",)}
        assert foreign_keys(before) == foreign_keys(after)  # untouched either way
    finally:
        migrate(latest)
    assert constraints() == after
