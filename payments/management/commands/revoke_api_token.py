"""``manage.py revoke_api_token USERNAME [--prefix P] [--json]``.

Revokes all the user's active tokens, or with ``--prefix`` the one whose
prefix (its first 12 characters, as the admin lists it) matches; a longer
value, such as the leaked token itself, is cut to its prefix. Each
revocation is audited (``ApiTokenEvent``, via ``cli``) and the token is
refused from the next request on. A prefix matching no active token is an
error. With ``--json`` stdout is exactly one JSON object
``{"username", "revoked"}`` (the revoked prefixes).
"""

import json

from django.core.management.base import BaseCommand, CommandError

from payments.exceptions import NotFound
from payments.management.commands.rotate_api_token import get_user
from payments.models import ApiTokenVia
from payments.tokens import PREFIX_LENGTH, api_tokens_revoke


class Command(BaseCommand):
    help = "Revoke a client's API tokens (all active ones, or the one with --prefix)."

    def add_arguments(self, parser):
        parser.add_argument("username", help="The client whose tokens are revoked.")
        parser.add_argument("--prefix", help="Only the token starting with this prefix.")
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")

    def handle(self, *args, username, prefix, **options):
        user = get_user(username)
        if prefix is not None:
            prefix = prefix.strip()[:PREFIX_LENGTH]
        try:
            revoked = api_tokens_revoke(user=user, prefix=prefix, actor=None, via=ApiTokenVia.CLI)
        except NotFound as exc:
            raise CommandError(exc.message) from None
        prefixes = [t.prefix for t in revoked]
        if options["json"]:
            self.stdout.write(json.dumps({"username": username, "revoked": prefixes}))
            return
        self.stdout.write(f"Revoked:  {', '.join(prefixes) or 'none (no active token)'}")
