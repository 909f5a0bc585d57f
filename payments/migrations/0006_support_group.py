"""The Support group: what support staff need, nothing more.

They can look at payments, schedules, deliveries and the ledger, cancel
payments and retry dead letters (audited with their user), and freeze or
unfreeze accounts. They cannot edit payments or balances: there is no
``change_payment``, and balance adjustments need ``ledger.post_adjustment``,
which only privileged staff get.
"""

from django.db import migrations

SUPPORT_PERMISSIONS = {
    "payments": [
        "view_payment",
        "cancel_payment",
        "retry_payment",
        "view_deadletter",
        "view_paymentevent",
        "view_paymentattempt",
        "view_recurringpayment",
        "view_recurringoccurrence",
        "view_webhookendpoint",
        "view_webhookdelivery",
    ],
    "ledger": [
        "view_account",
        "freeze_account",
        "view_hold",
        "view_journalentry",
        "view_posting",
        "view_reconciliationrun",
    ],
}


def create_support_group(apps, schema_editor):
    from django.contrib.auth.management import create_permissions

    # Permissions are normally created after all migrations; make sure the
    # ones this group needs exist now.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    group_model = apps.get_model("auth", "Group")
    permission_model = apps.get_model("auth", "Permission")
    group, _ = group_model.objects.get_or_create(name="Support")
    for app_label, codenames in SUPPORT_PERMISSIONS.items():
        perms = permission_model.objects.filter(
            content_type__app_label=app_label, codename__in=codenames
        )
        missing = set(codenames) - set(perms.values_list("codename", flat=True))
        if missing:
            raise RuntimeError(f"missing permissions {sorted(missing)}")
        group.permissions.add(*perms)


def remove_support_group(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name="Support").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("payments", "0005_deadletter_alter_payment_options"),
        ("ledger", "0003_alter_account_options_reconciliationrun"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_support_group, remove_support_group)]
