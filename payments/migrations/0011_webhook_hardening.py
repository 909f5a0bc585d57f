from django.db import migrations, models
from django.db.models import Q, Value
from django.db.models.functions import Concat, Substr

GENERIC = (
    "timeout",
    "connection_failed",
    "tls_error",
    "address_not_allowed",
    "redirect_not_followed",
    "invalid_response",
    "endpoint_disabled",
    "circuit_open",
    "secret_unavailable",
)


def encrypt_secrets(apps, schema_editor):
    from payments.webhook_secrets import encrypt

    endpoint_model = apps.get_model("payments", "WebhookEndpoint")
    for pk, secret in endpoint_model.objects.values_list("pk", "secret").iterator():
        endpoint_model.objects.filter(pk=pk).update(secret_ciphertext=encrypt(secret), secret="")


def decrypt_secrets(apps, schema_editor):
    from payments.webhook_secrets import decrypt

    endpoint_model = apps.get_model("payments", "WebhookEndpoint")
    rows = endpoint_model.objects.values_list("pk", "secret_ciphertext").iterator()
    for pk, ciphertext in rows:
        endpoint_model.objects.filter(pk=pk).update(secret=decrypt(ciphertext))


def generic_error_classes(apps, schema_editor):
    """Logged raw network messages (a port-scan oracle in the API's delivery log)
    become the generic classes the new code writes."""
    for model_name, field in (("WebhookDelivery", "last_error"), ("WebhookAttempt", "error")):
        model = apps.get_model("payments", model_name)
        raw = model.objects.exclude(**{field: ""}).exclude(**{f"{field}__in": GENERIC})
        raw.filter(**{f"{field}__regex": r"^HTTP [0-9]+$"}).update(
            **{field: Concat(Value("http_"), Substr(field, 6))}
        )
        raw = raw.exclude(**{f"{field}__regex": r"^http_[0-9]+$"})
        raw.filter(Q(**{f"{field}__icontains": "timed out"})).update(**{field: "timeout"})
        raw.exclude(**{f"{field}__in": GENERIC}).update(**{field: "connection_failed"})


class Migration(migrations.Migration):
    """Webhook hardening: signing secrets encrypted at rest, per-endpoint circuit
    breaker, generic error classes in the delivery log."""

    dependencies = [("payments", "0010_isolated_queues")]

    operations = [
        migrations.AddField(
            model_name="webhookendpoint",
            name="secret_ciphertext",
            field=models.TextField(default="", editable=False),
            preserve_default=False,
        ),
        # A default so that reversing the removal below can re-add the column.
        migrations.AlterField(
            model_name="webhookendpoint",
            name="secret",
            field=models.CharField(max_length=100, default="", blank=True),
        ),
        migrations.RunPython(encrypt_secrets, decrypt_secrets),
        migrations.RemoveField(model_name="webhookendpoint", name="secret"),
        migrations.AddField(
            model_name="webhookendpoint",
            name="consecutive_failures",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="webhookendpoint",
            name="circuit_open_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="webhookendpoint",
            name="circuit_opens",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.RunPython(generic_error_classes, migrations.RunPython.noop),
    ]
