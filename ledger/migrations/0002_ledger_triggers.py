"""Ledger invariants enforced by PostgreSQL itself (DESIGN §3).

- ``ledger_entry_balanced``: a DEFERRABLE INITIALLY DEFERRED constraint
  trigger, fired for every inserted posting and every inserted entry, checks at
  commit that the entry has two or more postings summing to zero. Deferred so a
  transaction can insert an entry and its postings in any order.
- ``ledger_*_append_only``: UPDATE and DELETE of postings and journal entries
  are rejected; corrections are reversing entries.

Errors use SQLSTATE class 23 (integrity constraint violation) so Django raises
``IntegrityError``. SQLite (the embedded default) relies on the CHECK
constraints and the services; these triggers are skipped there.
"""

from django.db import migrations

FORWARD = r"""
CREATE FUNCTION ledger_check_entry_balanced() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    eid bigint;
    total numeric;
    n integer;
BEGIN
    IF TG_TABLE_NAME = 'ledger_posting' THEN
        eid := NEW.entry_id;
    ELSE
        eid := NEW.id;
    END IF;
    SELECT coalesce(sum(amount), 0), count(*) INTO total, n
      FROM ledger_posting WHERE entry_id = eid;
    IF total <> 0 OR n < 2 THEN
        RAISE EXCEPTION 'journal entry % is unbalanced: % postings summing to %', eid, n, total
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ledger_entry_balanced';
    END IF;
    RETURN NULL;
END;
$$;

CREATE CONSTRAINT TRIGGER ledger_posting_entry_balanced
    AFTER INSERT ON ledger_posting
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION ledger_check_entry_balanced();

CREATE CONSTRAINT TRIGGER ledger_journalentry_balanced
    AFTER INSERT ON ledger_journalentry
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION ledger_check_entry_balanced();

CREATE FUNCTION ledger_reject_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % rejected (post a reversing entry instead)',
        TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$;

CREATE TRIGGER ledger_posting_append_only
    BEFORE UPDATE OR DELETE ON ledger_posting
    FOR EACH ROW EXECUTE FUNCTION ledger_reject_change();

CREATE TRIGGER ledger_journalentry_append_only
    BEFORE UPDATE OR DELETE ON ledger_journalentry
    FOR EACH ROW EXECUTE FUNCTION ledger_reject_change();
"""

BACKWARD = r"""
DROP TRIGGER IF EXISTS ledger_journalentry_append_only ON ledger_journalentry;
DROP TRIGGER IF EXISTS ledger_posting_append_only ON ledger_posting;
DROP FUNCTION IF EXISTS ledger_reject_change();
DROP TRIGGER IF EXISTS ledger_journalentry_balanced ON ledger_journalentry;
DROP TRIGGER IF EXISTS ledger_posting_entry_balanced ON ledger_posting;
DROP FUNCTION IF EXISTS ledger_check_entry_balanced();
"""


def _run(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            # params=None: the PL/pgSQL bodies contain literal % signs.
            schema_editor.execute(sql, params=None)

    return run


class Migration(migrations.Migration):
    dependencies = [("ledger", "0001_initial")]

    operations = [migrations.RunPython(_run(FORWARD), _run(BACKWARD))]
