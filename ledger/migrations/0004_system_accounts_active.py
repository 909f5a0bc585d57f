from django.db import migrations, models


def reactivate_system_accounts(apps, schema_editor):
    """A system account frozen before this rule existed is made active again.

    A frozen issuance account refuses every deposit (``create_api_client``
    fails); the constraint below could not be added while one existed.
    """
    account_model = apps.get_model("ledger", "Account")
    account_model.objects.filter(system_code__isnull=False).exclude(status="active").update(
        status="active", version=models.F("version") + 1
    )


class Migration(migrations.Migration):
    """System accounts are always active: staff can no longer freeze or close them."""

    dependencies = [("ledger", "0003_alter_account_options_reconciliationrun")]

    operations = [
        migrations.RunPython(reactivate_system_accounts, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="account",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("system_code__isnull", True), ("status", "active"), _connector="OR"
                ),
                name="ledger_account_system_active",
            ),
        ),
    ]
