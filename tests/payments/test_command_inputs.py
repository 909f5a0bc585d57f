"""Bad arguments to create_api_client, rotate_api_token and seed_demo: a clear
CommandError and nothing written (an outside tester's findings, production mode)."""

import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from ledger.models import Account, JournalEntry
from payments.models import ApiToken, ApiTokenEvent
from tests.payments.test_commands import manage_py

pytestmark = pytest.mark.django_db

BIGINT_MAX = 2**63 - 1


def written():
    """Everything a command run could leave behind."""
    return (
        get_user_model().objects.count(),
        Account.objects.count(),
        JournalEntry.objects.count(),
        ApiToken.objects.count(),
        ApiTokenEvent.objects.count(),
    )


def create_api_client(*args):
    out = StringIO()
    call_command("create_api_client", *args, stdout=out)
    return out.getvalue()


# --- create_api_client: the name ------------------------------------------------


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "must not be empty"),
        ("x" * 200, "at most 150 characters"),
    ],
)
def test_create_api_client_refuses_an_empty_or_too_long_name(name, message):
    """``""`` crashed with ValueError "The given username must be set", 200
    characters with DataError "value too long for type character varying(150)":
    raw tracebacks. (On SQLite the long name was even written.)"""
    before = written()
    with pytest.raises(CommandError, match=message):
        create_api_client(name, "--json")
    assert written() == before


@pytest.mark.parametrize("name", ["frank smith", "gr@ce!", "tab\tbed", "nul\x00"])
def test_create_api_client_refuses_a_name_the_admin_cannot_save(name):
    """ "frank smith", "gr@ce!" and a name with a tab were accepted, but the admin
    then refused to save that user ("Enter a valid username…"), so staff could
    not deactivate the client there. The user model's own username validators
    decide now."""
    before = written()
    with pytest.raises(CommandError, match="Enter a valid username"):
        create_api_client(name, "--json")
    assert written() == before


def test_create_api_client_accepts_the_longest_valid_name():
    """A valid 150-character username passed the user table but made the account
    name "<name> #1" longer than its 100 characters: DataError. The account's
    name is shortened; the username is kept whole."""
    name = "n" * 150
    result = json.loads(create_api_client(name, "--accounts", "2", "--json"))
    assert result["username"] == name
    names = list(
        Account.objects.filter(pk__in=result["account_ids"])
        .order_by("pk")
        .values_list("name", flat=True)
    )
    assert [len(n) for n in names] == [100, 100]
    assert names[0].endswith(" #1") and names[1].endswith(" #2")


# --- create_api_client: the balance ---------------------------------------------


@pytest.mark.parametrize("balance", ["99999999999999999999999", str(BIGINT_MAX)])
def test_create_api_client_refuses_a_balance_past_the_ledgers_range(balance):
    """``--balance 99999999999999999999999`` and ``--balance 9223372036854775807``
    crashed with DataError "bigint out of range": the deposit takes the issuance
    account (which has already issued money) below -2**63. Refused up front,
    naming the limit."""
    create_api_client("earlier", "--json")  # issuance has issued money already
    before = written()
    with pytest.raises(
        CommandError, match=r"--balance.*(9223372036854775807|-9223372036854775808)"
    ):
        create_api_client("rich", "--balance", balance, "--json")
    assert written() == before


def test_create_api_client_refuses_a_total_the_issuance_account_cannot_issue():
    """Each account's balance fits, their sum does not: the same DataError traceback."""
    before = written()
    with pytest.raises(CommandError, match="issuance"):
        create_api_client("many", "--balance", str(2**62), "--accounts", "3", "--json")
    assert written() == before


def test_create_api_client_balance_within_the_range_still_works():
    result = json.loads(create_api_client("big", "--balance", str(2**62), "--json"))
    assert Account.objects.get(pk=result["account_ids"][0]).balance == 2**62


# --- rotate_api_token --------------------------------------------------------------


def test_rotate_api_token_refuses_a_too_long_token_name(alice):
    """``rotate_api_token demo2 --name <300 chars>`` crashed with DataError "value
    too long for type character varying(100)" (on SQLite: written)."""
    before = written()
    with pytest.raises(CommandError, match="at most 100 characters"):
        call_command("rotate_api_token", "alice", "--name", "t" * 300, stdout=StringIO())
    assert written() == before
    assert ApiToken.objects.get(user=alice.user, revoked_at__isnull=True).name == ""


def test_rotate_api_token_accepts_a_name_of_the_maximum_length(alice):
    out = StringIO()
    call_command("rotate_api_token", "alice", "--name", "t" * 100, "--json", stdout=out)
    prefix = json.loads(out.getvalue())["prefix"]
    assert ApiToken.objects.get(prefix=prefix).name == "t" * 100


def test_rotate_api_token_refuses_a_nul_in_the_token_name(alice):
    """A NUL in ``--name`` crashed with DataError "PostgreSQL text fields cannot
    contain NUL (0x00) bytes"."""
    before = written()
    with pytest.raises(CommandError, match="Null characters are not allowed"):
        call_command("rotate_api_token", "alice", "--name", "a\x00b", stdout=StringIO())
    assert written() == before


# --- seed_demo -----------------------------------------------------------------------


def test_seed_demo_refuses_an_existing_client_that_is_not_a_superuser(settings, tmp_path):
    """``seed_demo --username alice --password X`` for a client made by
    create_api_client exited 0, issued alice two new funded accounts and a new
    API token, and printed admin login directions that do not work (alice is
    not staff). README: it "creates a superuser and two funded accounts"."""
    settings.DEBUG = False
    settings.VAR_DIR = tmp_path
    create_api_client("alice", "--json")
    before = written()
    with pytest.raises(CommandError, match="'alice' exists and is not a superuser"):
        call_command(
            "seed_demo", "--username", "alice", "--password", "X-pass-1", stdout=StringIO()
        )
    assert written() == before
    assert not (tmp_path / "demo-token").exists()
    alice = get_user_model().objects.get(username="alice")
    assert not alice.is_staff and not alice.has_usable_password()


def test_seed_demo_refuses_staff_that_is_not_a_superuser(settings, tmp_path):
    settings.DEBUG = True
    settings.VAR_DIR = tmp_path
    get_user_model().objects.create_user(username="support", is_staff=True)
    before = written()
    with pytest.raises(CommandError, match="not a superuser"):
        call_command("seed_demo", "--username", "support", stdout=StringIO())
    assert written() == before


@pytest.mark.parametrize(("username", "message"), [("", "must not be empty"), ("a b", "valid")])
def test_seed_demo_refuses_a_username_it_cannot_create(settings, tmp_path, username, message):
    """``--username ""`` created a superuser with an empty username; "a b" one the
    admin then refuses to save."""
    settings.DEBUG = True
    settings.VAR_DIR = tmp_path
    before = written()
    with pytest.raises(CommandError, match=message):
        call_command("seed_demo", "--username", username, stdout=StringIO())
    assert written() == before


def test_seed_demo_still_reruns_for_an_existing_superuser(settings, tmp_path):
    """scripts/dev re-runs seed_demo on every start: for its own demo superuser (or
    one made by createsuperuser) it still completes the demo data, same token."""
    settings.DEBUG = True
    settings.VAR_DIR = tmp_path
    get_user_model().objects.create_superuser(username="root", password="root-pass-3")
    runs = [StringIO(), StringIO()]
    call_command("seed_demo", "--username", "root", stdout=runs[0])
    call_command("seed_demo", "--username", "root", stdout=runs[1])
    assert runs[0].getvalue() == runs[1].getvalue()
    assert "login root, its password unchanged" in runs[0].getvalue()
    assert Account.objects.filter(owner__username="root").count() == 2


# --- in a real process -----------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "args",
    [
        ["create_api_client", "", "--json"],
        ["create_api_client", "x" * 200, "--json"],
        ["create_api_client", "frank smith", "--json"],
        ["create_api_client", "rich", "--balance", "99999999999999999999999", "--json"],
        ["rotate_api_token", "holder", "--name", "t" * 300],
    ],
    ids=["empty", "long", "space", "balance", "token-name"],
)
def test_bad_arguments_exit_non_zero_with_one_line_and_no_traceback(args):
    """Operators saw raw tracebacks (ValueError, DataError) for these, or for
    "frank smith" a success; now: exit 1, a one-line ``CommandError: …``,
    nothing on stdout, nothing written."""
    get_user_model().objects.create_user(username="holder")
    before = written()
    proc = manage_py(*args)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("CommandError: ") and proc.stderr.count("\n") == 1
    assert proc.stdout == ""
    assert written() == before
