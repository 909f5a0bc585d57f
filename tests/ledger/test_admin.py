import json
import re
from io import StringIO

import pytest
from django.contrib.messages import get_messages
from django.core.management import call_command
from django.urls import reverse

from ledger import services as ledger
from ledger.models import Account
from tests.factories import AccountFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    return client


def statement_rows(html: str) -> list[list[str]]:
    """Cells of the account statement table, newest first."""
    table = re.search(r'<table class="statement".*?</table>', html, re.S).group(0)
    body = table.split("<tbody>", 1)[1]
    return [
        [cell.strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)
    ]


def test_pages_render_and_money_is_read_only(admin_client):
    a, b = AccountFactory(funded=500), AccountFactory()
    entry = ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=200)
    hold = ledger.hold_place(account_id=a.pk, amount=50)
    for name in ("account", "hold", "journalentry"):
        assert admin_client.get(reverse(f"admin:ledger_{name}_changelist")).status_code == 200
    page = admin_client.get(reverse("admin:ledger_account_change", args=[a.pk]))
    assert page.status_code == 200
    form_fields = page.context["adminform"].form.fields
    assert "balance" not in form_fields and "held" not in form_fields
    rows = statement_rows(page.content.decode())
    assert [row[1:4] for row in rows] == [["-200", "300", "Transfer"], ["+500", "500", "Deposit"]]
    assert rows[0][4] == (
        f'<a href="/admin/ledger/journalentry/{entry.pk}/change/">entry #{entry.pk}</a>'
    )
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", row[0]) for row in rows)
    for name, pk in (("hold", hold.pk), ("journalentry", entry.pk)):
        page = admin_client.get(reverse(f"admin:ledger_{name}_change", args=[pk]))
        assert page.status_code == 200
        assert not page.context["has_change_permission"]


def test_posting_to_change_form_cannot_alter_balance(admin_client):
    a = AccountFactory(funded=500)
    url = reverse("admin:ledger_account_change", args=[a.pk])
    admin_client.post(
        url, {"owner": a.owner_id, "name": "renamed", "max_payment_amount": 10, "balance": 9_999}
    )
    a.refresh_from_db()
    assert (a.name, a.balance) == ("renamed", 500)


def test_freeze_action_goes_through_the_service(admin_client):
    a = AccountFactory()
    admin_client.post(
        reverse("admin:ledger_account_changelist"),
        {"action": "freeze", "_selected_action": [a.pk]},
    )
    assert Account.objects.get(pk=a.pk).status == "frozen"


def test_freeze_and_unfreeze_actions_skip_system_accounts(admin_client):
    """Freezing issuance broke create_api_client: the action refuses it, by name."""
    client_account = AccountFactory()
    issuance = ledger.issuance_account()
    for action, expected in (("freeze", "frozen"), ("unfreeze", "active")):
        response = admin_client.post(
            reverse("admin:ledger_account_changelist"),
            {"action": action, "_selected_action": [issuance.pk, client_account.pk]},
        )
        texts = [str(m) for m in get_messages(response.wsgi_request)]
        assert any("system account" in t and f"#{issuance.pk}" in t for t in texts), texts
        assert Account.objects.get(pk=client_account.pk).status == expected
        assert Account.objects.get(pk=issuance.pk).status == "active"
    out = StringIO()
    call_command("create_api_client", "after-freeze", "--balance", "10", "--json", stdout=out)
    (account_id,) = json.loads(out.getvalue())["account_ids"]
    assert Account.objects.get(pk=account_id).balance == 10


def test_account_owner_is_fixed_once_created(admin_client):
    """Payments copy their source account's owner: an account cannot change hands."""
    a = AccountFactory()
    owner = a.owner_id
    page = admin_client.get(reverse("admin:ledger_account_change", args=[a.pk]))
    assert "owner" not in page.context["adminform"].form.fields
    admin_client.post(
        reverse("admin:ledger_account_change", args=[a.pk]),
        {"owner": UserFactory().pk, "name": "renamed", "max_payment_amount": 10},
    )
    a.refresh_from_db()
    assert (a.owner_id, a.name) == (owner, "renamed")
    page = admin_client.get(reverse("admin:ledger_account_add"))
    assert "owner" in page.context["adminform"].form.fields
