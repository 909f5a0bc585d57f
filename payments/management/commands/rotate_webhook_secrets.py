"""``manage.py rotate_webhook_secrets``: re-encrypt every webhook signing secret
with the first key of ``WEBHOOK_SECRET_KEYS``.

Key rotation: put the new key first (keep the old ones after it), deploy, run
this command, then remove the old keys. Safe to run again or while deliveries
run: each row is rewritten under its row lock, and any configured key still
decrypts rows not yet rewritten. A secret no configured key decrypts does not
stop the others: every other row is rewritten, then the command names the
endpoints it could not rewrite and exits non-zero (do not remove the old keys
until it exits 0).
"""

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from payments import webhook_secrets
from payments.models import WebhookEndpoint


class Command(BaseCommand):
    help = "Re-encrypt webhook signing secrets with the current (first) key."

    def handle(self, *args, **options):
        rotated, unreadable = 0, []
        for pk in WebhookEndpoint.objects.values_list("pk", flat=True).iterator():
            with transaction.atomic():
                endpoint = (
                    WebhookEndpoint.objects.select_for_update(no_key=True).filter(pk=pk).first()
                )
                if endpoint is None:
                    continue
                try:
                    endpoint.secret_ciphertext = webhook_secrets.reencrypt(
                        endpoint.secret_ciphertext
                    )
                except webhook_secrets.InvalidToken:
                    unreadable.append(pk)
                    continue
                endpoint.save(update_fields=["secret_ciphertext"])
                rotated += 1
        self.stdout.write(f"Re-encrypted {rotated} webhook secret(s).")
        if unreadable:
            listed = ", ".join(str(pk) for pk in unreadable)
            raise CommandError(
                f"{len(unreadable)} webhook endpoint(s) have a secret no configured key "
                f"decrypts, left as they are: {listed}. Keep the old keys until they are "
                "re-registered or deleted."
            )
