from django.db import migrations

from payments.periodic import install_from_migration


class Migration(migrations.Migration):
    """Moves the sweeper, lease reaper and recurring materialiser to the "timers" queue."""

    dependencies = [("payments", "0008_status_labels")]

    operations = [migrations.RunPython(install_from_migration, migrations.RunPython.noop)]
