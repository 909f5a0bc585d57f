from django.db import migrations, models


class Migration(migrations.Migration):
    """The beat's scan of due webhook deliveries takes them in turns across
    endpoints (``webhooks.due_delivery_ids``): the pending deliveries' index is
    by endpoint, then due time. The new one is built before the old one goes.
    Both are partial (pending deliveries only), but building one reads the
    whole table and blocks writes to it meanwhile: on a table of many millions
    of finished deliveries, run it in a quiet moment."""

    dependencies = [
        ("payments", "0020_webhook_delivery_log"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="webhookdelivery",
            index=models.Index(
                condition=models.Q(("status", "pending")),
                fields=["endpoint", "next_attempt_at"],
                name="webhook_pending_by_endpoint",
            ),
        ),
        migrations.RemoveIndex(
            model_name="webhookdelivery",
            name="webhook_pending_next_attempt",
        ),
    ]
