"""Migration 0011 (webhook hardening) on a database that has webhook rows from before it."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from payments import webhook_secrets
from payments.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from tests.payments.helpers import migrate

BEFORE = [("payments", "0009_timer_queue")]
PLAINTEXT = "whsec_stored-in-clear-by-the-old-code"


def raw_endpoints():
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM payments_webhookendpoint")
        return repr(cursor.fetchall())


@pytest.mark.django_db(transaction=True)
def test_secrets_are_encrypted_and_raw_errors_become_classes():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    try:
        apps = migrate(BEFORE)
        user = apps.get_model("auth", "User").objects.create(username="legacy")
        endpoint = apps.get_model("payments", "WebhookEndpoint").objects.create(
            client=user, url="https://hooks.example.com/", secret=PLAINTEXT, event_types=[]
        )
        deliveries = apps.get_model("payments", "WebhookDelivery")
        attempts = apps.get_model("payments", "WebhookAttempt")
        legacy_errors = {
            "ConnectionRefusedError: [Errno 111] Connection refused": "connection_failed",
            "URLError: <urlopen error timed out>": "timeout",
            "HTTP 503": "http_503",
            "": "",
        }
        for text in legacy_errors:
            delivery = deliveries.objects.create(
                endpoint=endpoint, event_type="payment.failed", payload={}, last_error=text
            )
            attempts.objects.create(delivery=delivery, number=1, error=text)
        assert PLAINTEXT in raw_endpoints()

        migrate(latest)
        assert PLAINTEXT not in raw_endpoints()
        migrated = WebhookEndpoint.objects.get()
        assert webhook_secrets.decrypt(migrated.secret_ciphertext) == PLAINTEXT
        assert sorted(WebhookDelivery.objects.values_list("last_error", flat=True)) == sorted(
            legacy_errors.values()
        )
        assert sorted(WebhookAttempt.objects.values_list("error", flat=True)) == sorted(
            legacy_errors.values()
        )

        apps = migrate(BEFORE)  # reversible: the secret comes back for the old code
        assert apps.get_model("payments", "WebhookEndpoint").objects.get().secret == PLAINTEXT
    finally:
        migrate(latest)
