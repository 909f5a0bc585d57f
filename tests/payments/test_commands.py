import json
import os
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from rest_framework.test import APIClient

from ledger.models import Account

pytestmark = pytest.mark.django_db


def test_create_api_client_json_contract():
    out = StringIO()
    call_command(
        "create_api_client", "acme", "--balance", "5000", "--accounts", "3", "--json", stdout=out
    )
    result = json.loads(out.getvalue())  # exactly one JSON object
    assert set(result) == {"username", "token", "account_ids"}
    assert result["username"] == "acme" and len(result["account_ids"]) == 3
    balances = Account.objects.filter(pk__in=result["account_ids"]).values_list(
        "balance", flat=True
    )
    assert list(balances) == [5000, 5000, 5000]
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {result['token']}")
    listed = api.get("/api/v1/accounts").json()["accounts"]
    assert [a["account_id"] for a in listed] == result["account_ids"]
    with pytest.raises(CommandError, match="already exists"):
        call_command("create_api_client", "acme", "--json", stdout=StringIO())


def test_create_api_client_racing_another_run_for_the_same_name_says_so(monkeypatch):
    """Two runs at once with one name: both pass the exists() check, and the second
    ended in an IntegrityError traceback. It is the same CommandError, nothing of
    it left behind."""
    from django.contrib.auth import get_user_model
    from django.db.models.query import QuerySet

    get_user_model().objects.create_user(username="acme")  # the other run, committed first
    accounts = Account.objects.count()
    monkeypatch.setattr(QuerySet, "exists", lambda self: False)  # checked before it committed
    with pytest.raises(CommandError, match="'acme' already exists"):
        call_command("create_api_client", "acme", "--json", stdout=StringIO())
    assert Account.objects.count() == accounts


def manage_py(*args: str, **env: str) -> subprocess.CompletedProcess:
    """``manage.py ARGS`` in a process of its own, on the test database."""
    db = connection.settings_dict
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        capture_output=True,
        text=True,
        check=False,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "scheduler_project.settings.test",
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            **env,
        },
    )


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_create_api_client_json_is_the_only_stdout_in_a_real_process():
    """Operators pipe it into jq: nothing but the JSON object may reach stdout."""
    proc = manage_py("create_api_client", "scripted", "--json", LOG_FORMAT="json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["username"] == "scripted" and len(result["account_ids"]) == 1


def test_seed_demo_is_idempotent(settings, tmp_path):
    settings.DEBUG = True
    settings.VAR_DIR = tmp_path
    out = StringIO()
    call_command("seed_demo", stdout=out)
    call_command("seed_demo", stdout=out)
    text = out.getvalue()
    assert "login demo / demo" in text and "Bearer" in text
    assert Account.objects.filter(owner__username="demo").count() == 2
    settings.DEBUG = False
    with pytest.raises(CommandError, match="password"):
        call_command("seed_demo", stdout=StringIO())


def test_seed_demo_interrupted_between_account_and_deposit_is_completed_by_a_rerun(
    settings, tmp_path, monkeypatch
):
    """The account and its deposit committed separately: a run that died between
    them left "Demo savings" at 0 and every later run skipped it (a reviewer's
    finding)."""
    from django.db import OperationalError

    from ledger import services as ledger_services

    settings.DEBUG = True
    settings.VAR_DIR = tmp_path
    real_deposit = ledger_services.deposit
    calls = []

    def deposit_dies_the_second_time(**kwargs):
        calls.append(kwargs)
        if len(calls) == 2:
            raise OperationalError("server closed the connection unexpectedly")
        return real_deposit(**kwargs)

    monkeypatch.setattr(ledger_services, "deposit", deposit_dies_the_second_time)
    with pytest.raises(OperationalError):
        call_command("seed_demo", stdout=StringIO())
    monkeypatch.setattr(ledger_services, "deposit", real_deposit)
    call_command("seed_demo", stdout=StringIO())
    call_command("seed_demo", stdout=StringIO())  # and no second deposit
    balances = dict(Account.objects.filter(owner__username="demo").values_list("name", "balance"))
    assert balances == {"Demo checking": 100_000, "Demo savings": 50_000}


def test_seed_demo_prints_a_login_that_works_and_no_real_password(settings, tmp_path):
    """It printed the password given now, though an existing user's is never reset
    (a second run with another --password printed a login that failed), and it
    echoed a real --password to the terminal."""
    from django.contrib.auth import get_user_model

    settings.DEBUG = False
    settings.VAR_DIR = tmp_path
    first = StringIO()
    call_command("seed_demo", "--password", "first-pass-7", stdout=first)
    assert "first-pass-7" not in first.getvalue()
    assert "login demo / the --password given" in first.getvalue()
    second = StringIO()
    call_command("seed_demo", "--password", "second-pass-9", stdout=second)
    assert "second-pass-9" not in second.getvalue()
    assert "login demo, its password unchanged" in second.getvalue()
    assert get_user_model().objects.get(username="demo").check_password("first-pass-7")
    again = StringIO()
    call_command("seed_demo", "--password", "first-pass-7", stdout=again)
    assert "login demo / the --password given" in again.getvalue()
