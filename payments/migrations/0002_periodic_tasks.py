from django.db import migrations

from payments.periodic import install_from_migration


def uninstall(apps, schema_editor):
    from payments.periodic import PERIODIC_TASKS

    task_model = apps.get_model("django_celery_beat", "PeriodicTask")
    task_model.objects.filter(name__in=[name for name, *_ in PERIODIC_TASKS]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("payments", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(install_from_migration, uninstall)]
