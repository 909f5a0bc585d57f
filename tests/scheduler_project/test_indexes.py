"""The index inventory of the service's own tables (PostgreSQL).

Every index is written on every insert, and on every update that is not HOT —
a payment's status changes never are — so the executor pays for each one
about twice per payment. Two rules keep the set honest:

- no index repeats the leading columns of another (a foreign key's automatic
  index beside a composite index that already leads with that key);
- every foreign key still leads some index — a partial one only where its
  condition is that very column being set (``WHERE key IS NOT NULL``: NULL on
  most rows), the one kind a look-up by the key can always use — so a
  ``PROTECT`` check or a join from the parent side never scans the table — but
  for the few listed in ``UNINDEXED_ON_PURPOSE``,
  whose parent rows are never deleted and which no query follows from the
  parent side.
"""

import pytest
from django.db import connection

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

# Every index of the ledger_* and payments_* tables: name, table, key columns
# with their operator classes, whether unique, whether partial.
INDEXES_SQL = """
SELECT i.relname, t.relname,
       array(SELECT a.attname || ':' || o.opcname
               FROM unnest(x.indkey, x.indclass) WITH ORDINALITY AS k(attnum, opclass, n)
               JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum
               JOIN pg_opclass o ON o.oid = k.opclass
              ORDER BY k.n),
       x.indisunique, x.indpred IS NOT NULL, pg_get_expr(x.indpred, x.indrelid)
  FROM pg_index x
  JOIN pg_class i ON i.oid = x.indexrelid
  JOIN pg_class t ON t.oid = x.indrelid
  JOIN pg_namespace s ON s.oid = t.relnamespace
 WHERE s.nspname = current_schema() AND t.relname ~ '^(ledger|payments)_'
"""

FOREIGN_KEYS_SQL = """
SELECT c.conname, t.relname, a.attname
  FROM pg_constraint c
  JOIN pg_class t ON t.oid = c.conrelid
  JOIN pg_namespace s ON s.oid = t.relnamespace
  JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = c.conkey[1]
 WHERE c.contype = 'f' AND s.nspname = current_schema() AND t.relname ~ '^(ledger|payments)_'
"""


def rows(sql):
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()


def test_no_index_repeats_the_leading_columns_of_another():
    indexes = rows(INDEXES_SQL)
    redundant = [
        (name, other)
        for name, table, columns, unique, partial, _ in indexes
        if not unique and not partial
        for other, other_table, other_columns, _, other_partial, _ in indexes
        if other != name
        and other_table == table
        and not other_partial
        and len(other_columns) >= len(columns)
        and other_columns[: len(columns)] == columns
    ]
    assert redundant == []


# Foreign keys that lead no index, on purpose: a payment's target account and
# its hold (payments 0017), a hold's account and capturing entry (ledger 0006). Their
# parents are never deleted (no service deletes an account, a hold or an
# entry, the admin refuses to — checked below — and journal entries are
# append-only in the database) and their keys never change once set, so no
# ``PROTECT`` check or FK check ever looks for the referencing rows. No query
# looks payments or holds up by them but one: the reconciliation's active holds
# of an account, through the partial index of active holds
# (``ledger_hold_active_by_account``, ``status = 'active'``), which a key check
# could not use. A plain index was only ever written — an entry per claim and
# per completion of a payment, per placing and per capture of a hold.
UNINDEXED_ON_PURPOSE = {
    ("payments_payment", "to_account_id"),
    ("payments_payment", "hold_id"),
    ("ledger_hold", "account_id"),
    ("ledger_hold", "entry_id"),
}


def test_every_foreign_key_leads_an_index():
    leading = set()
    for _, table, columns, _, _, condition in rows(INDEXES_SQL):
        column = columns[0].split(":")[0]
        # a partial index serves a look-up by its key only where its condition
        # is the key being set: ledger_hold_active_by_account (status =
        # 'active') does not count for a hold's account
        if condition is None or condition == f"({column} IS NOT NULL)":
            leading.add((table, column))
    unindexed = {
        (table, column)
        for _, table, column in rows(FOREIGN_KEYS_SQL)
        if (table, column) not in leading
    }
    # both ways: a new unindexed key fails, and so does a listed one indexed again
    assert unindexed == UNINDEXED_ON_PURPOSE


def test_the_parents_of_the_unindexed_keys_cannot_be_deleted_from_the_admin(rf, admin_user):
    from django.contrib import admin

    from ledger.models import Account, Hold, JournalEntry

    request = rf.get("/admin/")
    request.user = admin_user
    for model in (Account, Hold, JournalEntry):
        assert admin.site._registry[model].has_delete_permission(request) is False
