"""``manage.py create_api_client NAME [--balance N] [--accounts K] [--json]``.

Creates a client user, its API token and K funded accounts. With ``--json``
stdout is exactly one JSON object ``{"username", "token", "account_ids"}``
so operators can script it. The token is shown only here: only its hash is
stored.

Arguments are checked before anything is written: ``NAME`` must be a username
the admin can save (the user model's own validators and length), and the money
issued must fit the ledger's balances (a 64-bit integer): each ``--balance`` at
most the largest balance, and ``--balance`` times ``--accounts`` no more than the
issuance account can still issue before its balance reaches the smallest.
"""

import json

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import DataError, IntegrityError, connection, transaction

from ledger import services as ledger
from ledger.models import Account
from payments.models import ApiTokenVia
from payments.tokens import api_token_issue


def valid_username(user_model, name: str) -> str:
    """``name`` normalised as ``create_user`` stores it, or CommandError if the user
    model's username field (its validators, its max_length) refuses it — the
    checks the admin applies when staff save that user."""
    name = user_model.normalize_username(name)
    if not name:
        raise CommandError("The username must not be empty.")
    field = user_model._meta.get_field(user_model.USERNAME_FIELD)
    try:
        field.run_validators(name)
    except ValidationError as exc:
        raise CommandError(f"Invalid username {name!r}: {' '.join(exc.messages)}") from None
    return name


def balance_range() -> tuple[int, int]:
    """The smallest and largest balance the ledger's accounts can hold."""
    field = Account._meta.get_field("balance")
    return connection.ops.integer_field_range(field.get_internal_type())


def check_issuable(balance: int, accounts: int) -> None:
    """CommandError unless ``accounts`` deposits of ``balance`` fit the ledger."""
    lowest, highest = balance_range()
    if balance > highest:
        raise CommandError(
            f"--balance must be at most {highest} (the largest balance the ledger holds)."
        )
    issued = (
        Account.objects.filter(system_code=Account.ISSUANCE)
        .values_list("balance", flat=True)
        .first()
    ) or 0
    headroom = issued - lowest
    total = balance * accounts
    if total > headroom:
        raise CommandError(
            f"--balance {balance} x --accounts {accounts} = {total} is more than the"
            f" issuance account can still issue ({headroom}: its balance, {issued}, may not"
            f" go below {lowest}, the smallest balance the ledger holds)."
        )


def account_name(name: str, number: int) -> str:
    """``"<name> #<number>"``, the name shortened to fit the account's name field."""
    suffix = f" #{number}"
    limit = Account._meta.get_field("name").max_length
    return name[: limit - len(suffix)] + suffix


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
        name = valid_username(user_model, name)
        check_issuable(balance, accounts)
        if user_model.objects.filter(username=name).exists():
            raise CommandError(f"User {name!r} already exists.")
        try:
            result = self._create(user_model, name, balance, accounts)
        except IntegrityError:
            # the same name created at the same time by another run: nothing of this one stays
            raise CommandError(f"User {name!r} already exists.") from None
        except (DataError, OverflowError):
            # deposits made by others since check_issuable took the issuance account
            # out of range (OverflowError: SQLite's driver): all of this run rolled back
            raise CommandError(
                "The deposits would take the issuance account's balance out of range;"
                " nothing was written."
            ) from None
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
                account = ledger.account_create(owner=user, name=account_name(name, i + 1))
                if balance:
                    ledger.deposit(
                        account_id=account.pk,
                        amount=balance,
                        reference=f"initial:{account.pk}",
                        description="Initial funds",
                    )
                account_ids.append(account.pk)
        return {"username": name, "token": token, "account_ids": account_ids}
