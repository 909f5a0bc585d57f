"""``manage.py seed_demo``: a demo login and funded accounts for a local run.

Idempotent: running it again changes nothing and prints the same directions,
the same token included; a run that died half-way is completed by the next
(each account with its deposit in one transaction, a missing deposit made).
An existing user's password is never changed, and the password given with
``--password`` is not printed. Tokens are stored hashed, so the demo token's plain
text is kept in ``VAR_DIR/demo-token`` (mode 0600, next to the SQLite file that
holds the demo data anyway); a restart of ``scripts/dev`` prints it again
instead of revoking it. If that file is gone or its token was revoked, the
previous demo tokens are revoked and a new one issued (both audited).

It refuses to create the well-known demo password outside DEBUG unless
``--password`` is given. ``--username`` names the demo superuser: an existing
user who is not a superuser (an API client, staff) is refused, nothing written
(it would have been given funded accounts, a token and admin directions that do
not work); a new one must be a username the admin can save.
"""

from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from ledger import services as ledger
from ledger.models import Account, JournalEntry
from payments.management.commands.create_api_client import valid_username
from payments.models import ApiToken, ApiTokenVia
from payments.tokens import api_token_issue, api_tokens_revoke, hash_token

DEMO_ACCOUNTS = (("Demo checking", 100_000), ("Demo savings", 50_000))


def demo_token(user, path: Path) -> str:
    """The saved demo token if it is still active, else a new one saved to ``path``."""
    saved = path.read_text().strip() if path.exists() else ""
    active = ApiToken.objects.filter(user=user, name="seed_demo", revoked_at__isnull=True)
    if saved and active.filter(key_hash=hash_token(saved)).exists():
        return saved
    api_tokens_revoke(user=user, name="seed_demo", actor=None, via=ApiTokenVia.CLI)
    _, token = api_token_issue(user=user, name="seed_demo", actor=None, via=ApiTokenVia.CLI)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(token + "\n")
    return token


class Command(BaseCommand):
    help = "Create the demo superuser and funded demo accounts; print how to log in."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="demo")
        parser.add_argument("--password", default=None, help="Default 'demo' (DEBUG only).")
        parser.add_argument("--base-url", default="http://127.0.0.1:8000")

    def handle(self, *args, **options):
        username = options["username"]
        password = options["password"]
        if password is None:
            if not settings.DEBUG:
                raise CommandError("Pass --password: the default demo password is DEBUG-only.")
            password = "demo"  # noqa: S105 - documented local-only demo login
        user_model = get_user_model()
        if not user_model.objects.filter(username=username).exists():
            # the name of a superuser to create, as create_user would store it
            username = valid_username(user_model, username)
        with transaction.atomic():
            user, created = user_model.objects.get_or_create(
                username=username, defaults={"is_staff": True, "is_superuser": True}
            )
            if not created and not user.is_superuser:
                # README: it "creates a superuser"; an existing client or staff user
                # must not get issued money, a token and directions that do not work
                raise CommandError(
                    f"User {username!r} exists and is not a superuser; seed_demo sets up"
                    " a demo superuser: pass another --username."
                )
            if created:
                user.set_password(password)
                user.save(update_fields=["password"])
        ledger.issuance_account()
        for name, amount in DEMO_ACCOUNTS:
            # the account and its funds in one transaction, and funded whenever
            # its deposit is missing: a run that died between the two left the
            # account at 0 and every later run skipped it ("idempotent")
            with transaction.atomic():
                account = Account.objects.filter(owner=user, name=name).first()
                if account is None:
                    account = ledger.account_create(owner=user, name=name)
                reference = f"seed_demo:{account.pk}"
                if not JournalEntry.objects.filter(reference=reference).exists():
                    ledger.deposit(
                        account_id=account.pk,
                        amount=amount,
                        reference=reference,
                        description="Demo funds",
                    )
        token = demo_token(user, Path(settings.VAR_DIR) / "demo-token")
        accounts = list(Account.objects.filter(owner=user).order_by("pk"))
        base = options["base_url"].rstrip("/")
        # a login that works: an existing user's password is never reset, so it
        # is told only if it is the one this run knows
        if not (created or user.check_password(password)):
            login = f"login {username}, its password unchanged"
        elif options["password"] is None:
            login = f"login {username} / {password}"  # the documented DEBUG-only demo login
        else:  # not echoed: it may be a real one
            login = f"login {username} / the --password given"
        self.stdout.write(f"Admin:    {base}/admin/   ({login})")
        self.stdout.write(f"API docs: {base}/api/docs/")
        for account in accounts:
            self.stdout.write(f"Account:  #{account.pk} {account.name}: balance {account.balance}")
        self.stdout.write(f"Token:    {token}")
        self.stdout.write("Try:")
        self.stdout.write(f"  export TOKEN={token}")
        self.stdout.write(
            f"  curl -s -X POST {base}/api/v1/payments/schedule"
            ' -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json"'
            f""" -d '{{"from_account_id": {accounts[0].pk}, "to_account_id": {accounts[1].pk},"""
            """ "amount": 250, "delay_seconds": 10}'"""
        )
        self.stdout.write(f'  curl -s {base}/api/v1/payments -H "Authorization: Bearer $TOKEN"')
