"""``Payment.owner``: the source account's owner, denormalised for the client listing.

1. add the column (nullable: a source account without owner has none);
2. backfill it from the source account;
3. PostgreSQL only: the trigger ``payments_payment_owner`` refuses any row
   whose owner is not its source account's owner, on INSERT and whenever
   ``owner_id`` or ``from_account_id`` is updated (status updates do not fire
   it), so no insert path can forget it or get it wrong;
4. the two listing indexes.

On a large table, run it in a quiet period: the backfill rewrites every row
and CREATE INDEX blocks writes to payments while it runs.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

TRIGGER = r"""
CREATE FUNCTION payments_check_owner() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.owner_id IS DISTINCT FROM
       (SELECT owner_id FROM ledger_account WHERE id = NEW.from_account_id) THEN
        RAISE EXCEPTION 'payment % has owner %, not the owner of its source account %',
            NEW.id, NEW.owner_id, NEW.from_account_id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'payments_payment_owner';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER payments_payment_owner
    BEFORE INSERT OR UPDATE OF owner_id, from_account_id ON payments_payment
    FOR EACH ROW EXECUTE FUNCTION payments_check_owner();
"""

DROP_TRIGGER = r"""
DROP TRIGGER IF EXISTS payments_payment_owner ON payments_payment;
DROP FUNCTION IF EXISTS payments_check_owner();
"""


def backfill_owner(apps, schema_editor):
    payment_model = apps.get_model("payments", "Payment")
    account_model = apps.get_model("ledger", "Account")
    owner = account_model.objects.filter(pk=models.OuterRef("from_account_id")).values("owner_id")
    payment_model.objects.update(owner_id=models.Subquery(owner[:1]))


def _postgres(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql, params=None)  # literal % in the PL/pgSQL body

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("payments", "0011_webhook_hardening"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="payment",
            name="owner",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                editable=False,
                help_text="The source account's owner (the client who sees this payment).",
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.RunPython(backfill_owner, migrations.RunPython.noop),
        migrations.RunPython(_postgres(TRIGGER), _postgres(DROP_TRIGGER)),
        migrations.AddIndex(
            model_name="payment",
            index=models.Index(fields=["owner", "-created_at", "-id"], name="payments_by_owner"),
        ),
        migrations.AddIndex(
            model_name="payment",
            index=models.Index(
                fields=["owner", "status", "-created_at", "-id"], name="payments_by_owner_status"
            ),
        ),
    ]
