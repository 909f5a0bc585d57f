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


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_create_api_client_json_is_the_only_stdout_in_a_real_process():
    """Operators pipe it into jq: nothing but the JSON object may reach stdout."""
    db = connection.settings_dict
    proc = subprocess.run(
        [sys.executable, "manage.py", "create_api_client", "scripted", "--json"],
        capture_output=True,
        text=True,
        check=True,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "scheduler_project.settings.test",
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "LOG_FORMAT": "json",
        },
    )
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
