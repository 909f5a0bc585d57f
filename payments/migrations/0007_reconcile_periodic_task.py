from django.db import migrations

from payments.periodic import install_from_migration


class Migration(migrations.Migration):
    """Adds hourly ledger reconciliation to the beat schedule."""

    dependencies = [("payments", "0006_support_group")]

    operations = [migrations.RunPython(install_from_migration, migrations.RunPython.noop)]
