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


def test_saving_the_account_form_never_writes_money_read_before_a_posting(
    admin_client, monkeypatch
):
    """A posting committed while the change form is saved must survive it: the form
    writes only the fields it edits (a plain save wrote back the balance read at the
    start of the POST — a reviewer saw 500 of a 1,500 balance vanish and the books
    stop reconciling)."""
    from ledger.admin import AccountAdmin

    a = AccountFactory(funded=1000)
    real_get_object = AccountAdmin.get_object

    def get_object_then_a_deposit_lands(self, request, object_id, from_field=None):
        obj = real_get_object(self, request, object_id, from_field)
        ledger.deposit(account_id=a.pk, amount=500)  # another client's money arrives now
        return obj

    monkeypatch.setattr(AccountAdmin, "get_object", get_object_then_a_deposit_lands)
    url = reverse("admin:ledger_account_change", args=[a.pk])
    response = admin_client.post(url, {"name": "renamed", "max_payment_amount": 10})
    assert response.status_code == 302
    a.refresh_from_db()
    assert (a.name, a.max_payment_amount, a.balance) == ("renamed", 10, 1500)
    assert ledger_reconcile_ok()


def ledger_reconcile_ok() -> bool:
    from ledger.reconciliation import reconcile

    return reconcile().ok


def _adjust(client, account, amount):
    return client.post(
        reverse("admin:ledger_account_adjust", args=[account.pk]),
        {"amount": amount, "reason": "test"},
    )


def test_an_adjustment_refuses_system_accounts_and_out_of_range_amounts(admin_client):
    from ledger.models import JournalEntry

    issuance = ledger.issuance_account()
    response = _adjust(admin_client, issuance, 100)
    assert response.status_code == 200
    assert "system account" in " ".join(response.context["form"].non_field_errors())
    a = AccountFactory(funded=10)
    for amount in (10**19, -(10**19)):  # past the 64-bit range: a form error, not a 500
        response = _adjust(admin_client, a, amount)
        assert response.status_code == 200 and "amount" in response.context["form"].errors
    response = _adjust(admin_client, a, 2**63 - 1)  # in range, but issuance would overflow
    assert response.status_code == 200
    assert response.context["form"].errors["amount"] == [
        "This amount would take a balance out of range."
    ]
    assert not JournalEntry.objects.filter(kind="adjustment").exists()
    assert Account.objects.get(pk=a.pk).balance == 10
    assert ledger_reconcile_ok()


def _messages(response) -> list[str]:
    """The messages the redirected-to page showed (so the next request starts afresh)."""
    return [str(m) for m in response.context["messages"]]


def test_bulk_actions_are_bounded_and_report_one_by_one(admin_client, settings, monkeypatch):
    """DESIGN §8 for staff's actions: a selection over ADMIN_ACTION_MAX_ITEMS is
    refused with nothing done; refusals are summed up (the first five named); a
    database error stops the action and says how far it got."""
    from django.db import OperationalError

    settings.ADMIN_ACTION_MAX_ITEMS = 3
    accounts = [AccountFactory() for _ in range(4)]
    changelist = reverse("admin:ledger_account_changelist")
    response = admin_client.post(
        changelist, {"action": "freeze", "_selected_action": [a.pk for a in accounts]}, follow=True
    )
    assert _messages(response) == [
        "More than 3 selected: an action handles at most 3 at once. "
        "Narrow the selection (a filter) and run it again; nothing was done."
    ]
    assert set(
        Account.objects.filter(pk__in=[a.pk for a in accounts]).values_list("status", flat=True)
    ) == {"active"}

    settings.ADMIN_ACTION_MAX_ITEMS = 10
    closed = [AccountFactory() for _ in range(7)]  # freezing a closed account is refused
    Account.objects.filter(pk__in=[c.pk for c in closed]).update(status="closed")
    selected = sorted(c.pk for c in closed)
    response = admin_client.post(
        changelist,
        {"action": "freeze", "_selected_action": [*selected, accounts[0].pk]},
        follow=True,
    )
    refused, done = _messages(response)
    named = "; ".join(f"{pk}: Account {pk} is closed." for pk in selected[:5])
    assert refused == f"7 refused — {named}; and 2 more"
    assert done == "1 account(s) set to frozen."

    real = ledger.account_set_status
    calls = []

    def flaky(**kwargs):
        calls.append(kwargs["account_id"])
        if len(calls) == 2:
            raise OperationalError("deadlock detected")
        return real(**kwargs)

    monkeypatch.setattr(ledger, "account_set_status", flaky)
    ids = sorted(a.pk for a in accounts[1:])
    response = admin_client.post(
        changelist, {"action": "freeze", "_selected_action": ids}, follow=True
    )
    texts = _messages(response)
    assert texts[0].startswith(
        f"Stopped at {calls[1]}: the database refused (OperationalError). 1 done"
    )
    assert texts[-1] == "1 account(s) set to frozen."
    assert len(calls) == 2
