"""The operators' execute-now trigger (payments.services.payment_execute_now, internal API)."""

import pytest

from ledger.models import Account, JournalEntry
from tests.payments.helpers import make_due

pytestmark = pytest.mark.django_db


def schedule(client, n=1, **overrides):
    return [client.schedule(**overrides).json()["payment_id"] for _ in range(n)]


def balances(client):
    return [Account.objects.get(pk=a.pk).balance for a in (client.account, client.other_account)]


def test_internal_execute_endpoint(alice, settings, monkeypatch):
    settings.INTERNAL_API_TOKEN = "s3cret"
    (pid,) = schedule(alice, amount=40)
    url = f"/api/v1/internal/payments/{pid}/execute"
    api = alice.api.__class__()
    body = {"execution_id": "op-1"}
    assert api.post(url, body, format="json").status_code == 404
    assert (
        api.post(url, body, format="json", headers={"X-Internal-Auth": "nope"}).status_code == 404
    )
    auth = {"X-Internal-Auth": "s3cret"}
    response = api.post(url, body, format="json", headers=auth)
    assert response.status_code == 409 and response.json()["error"]["code"] == "payment_not_due"
    make_due(pid)
    response = api.post(url, body, format="json", headers=auth)
    assert response.status_code == 200
    assert response.json()["status"] == "COMPLETED" and response.json()["execution_id"] == "op-1"
    again = api.post(url, body, format="json", headers=auth)
    assert again.status_code == 200 and again.json()["status"] == "COMPLETED"
    assert JournalEntry.objects.filter(reference=f"payment:{pid}").count() == 1
    assert balances(alice) == [9_960, 40]
