from django.db import migrations

from payments.periodic import install_from_migration


class Migration(migrations.Migration):
    """The materialiser moves to the "recurring" queue and the webhook retry scan to
    "webhooks": each kind of background work on a worker of its own (DESIGN §8)."""

    dependencies = [("payments", "0009_timer_queue")]

    operations = [migrations.RunPython(install_from_migration, migrations.RunPython.noop)]
