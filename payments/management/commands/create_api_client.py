"""``manage.py create_api_client NAME [--balance N] [--accounts K] [--json]``.

Creates a client user, its API token and K funded accounts. With ``--json``
stdout is exactly one JSON object ``{"username", "token", "account_ids"}``
so operators can script it. The token is shown only here: only its hash is
stored.
"""

import json

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError, transaction

from ledger import services as ledger
from payments.models import ApiTokenVia
from payments.tokens import api_token_issue


class Command(BaseCommand):
    help = "Create an API client user with a token and funded accounts."

    def add_arguments(self, parser):
        parser.add_argument("name", help="Username of the new client.")
        parser.add_argument("--balance", type=int, default=100_000, help="Funds per account.")
        parser.add_argument("--accounts", type=int, default=1, help="Number of accounts.")
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")

    def handle(self, *args, name, balance, accounts, **options):
        if balance < 0:
            raise CommandError("--balance must be >= 0.")
        if not 1 <= accounts <= 1000:
            raise CommandError("--accounts must be between 1 and 1000.")
        user_model = get_user_model()
        if user_model.objects.filter(username=name).exists():
            raise CommandError(f"User {name!r} already exists.")
        try:
            result = self._create(user_model, name, balance, accounts)
        except IntegrityError:
            # the same name created at the same time by another run: nothing of this one stays
            raise CommandError(f"User {name!r} already exists.") from None
        if options["json"]:
            self.stdout.write(json.dumps(result))
        else:
            self.stdout.write(f"Client:   {name}")
            self.stdout.write(f"Token:    {result['token']}   (shown once)")
            ids = ", ".join(map(str, result["account_ids"]))
            self.stdout.write(f"Accounts: {ids} ({balance} each)")

    @staticmethod
    def _create(user_model, name, balance, accounts):
        with transaction.atomic():
            user = user_model.objects.create_user(username=name)
            _, token = api_token_issue(
                user=user, name="create_api_client", actor=None, via=ApiTokenVia.CLI
            )
            account_ids = []
            for i in range(accounts):
                account = ledger.account_create(owner=user, name=f"{name} #{i + 1}")
                if balance:
                    ledger.deposit(
                        account_id=account.pk,
                        amount=balance,
                        reference=f"initial:{account.pk}",
                        description="Initial funds",
                    )
                account_ids.append(account.pk)
        return {"username": name, "token": token, "account_ids": account_ids}
