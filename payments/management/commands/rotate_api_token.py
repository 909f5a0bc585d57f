"""``manage.py rotate_api_token USERNAME [--name N] [--json]``.

Revokes every active token of the user and issues one new token, in one
transaction; both are audited (``ApiTokenEvent``, via ``cli``). The new
token is printed once: only its hash is stored. With ``--json`` stdout is
exactly one JSON object ``{"username", "token", "prefix", "revoked"}``
(``revoked``: the prefixes of the tokens revoked). A ``--name`` the token's
name field cannot store (too long, a NUL character) is refused before anything
is written.
"""

import json

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.core.validators import ProhibitNullCharactersValidator

from payments.models import ApiToken, ApiTokenVia
from payments.tokens import api_token_rotate


def get_user(username: str):
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise CommandError(f"No user {username!r}.")
    return user


def valid_token_name(name: str) -> str:
    """``name`` if the token's name field can store it, else CommandError."""
    field = ApiToken._meta.get_field("name")
    try:
        ProhibitNullCharactersValidator()(name)
        field.run_validators(name)
    except ValidationError as exc:
        raise CommandError(f"Invalid --name: {' '.join(exc.messages)}") from None
    return name


class Command(BaseCommand):
    help = "Revoke a client's active API tokens and issue a new one (printed once)."

    def add_arguments(self, parser):
        parser.add_argument("username", help="The client whose tokens are rotated.")
        parser.add_argument("--name", default="rotate_api_token", help="Name of the new token.")
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")

    def handle(self, *args, username, name, **options):
        name = valid_token_name(name)
        user = get_user(username)
        record, token, revoked = api_token_rotate(
            user=user, name=name, actor=None, via=ApiTokenVia.CLI
        )
        result = {
            "username": username,
            "token": token,
            "prefix": record.prefix,
            "revoked": [t.prefix for t in revoked],
        }
        if options["json"]:
            self.stdout.write(json.dumps(result))
            return
        self.stdout.write(f"Revoked:  {', '.join(result['revoked']) or 'none'}")
        self.stdout.write(f"Token:    {token}   (shown once)")
