from django.db import migrations

from payments.periodic import install_from_migration


class Migration(migrations.Migration):
    """Adds the recurring materialiser and the webhook retry task to the beat schedule."""

    dependencies = [("payments", "0003_recurring_webhooks")]

    operations = [migrations.RunPython(install_from_migration, migrations.RunPython.noop)]
