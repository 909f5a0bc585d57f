"""Two clients: every path with the other's payment id is 404, and nothing changes."""

import pytest

from ledger.models import Account
from payments.models import Payment, PaymentEvent
from tests.payments.test_api import error

pytestmark = pytest.mark.django_db


def snapshot():
    return (
        list(Payment.objects.order_by("pk").values()),
        list(Account.objects.order_by("pk").values("pk", "balance", "held", "version")),
        PaymentEvent.objects.count(),
    )


def test_every_payment_path_hides_other_clients_payments(alice, bob):
    payment_id = bob.schedule(amount=500).json()["payment_id"]
    before = snapshot()
    base = f"/api/v1/payments/{payment_id}"
    calls = [
        ("get", base, None),
        ("patch", base, {"amount": 1}),
        ("patch", base, {"delay_seconds": 10}),
        ("delete", f"{base}/cancel", None),
        ("post", f"{base}/cancel", {}),
        ("get", f"{base}/events", None),
        ("get", f"{base}/attempts", None),
    ]
    for method, url, body in calls:
        response = getattr(alice.api, method)(url, body, format="json")
        err = error(response, 404, "not_found")
        assert "bob" not in str(err)
    listing = alice.api.get("/api/v1/payments", {"account_id": bob.account.pk}).json()
    assert listing["payments"] == []
    assert snapshot() == before
    assert bob.api.get(base).status_code == 200


def test_account_paths_hide_other_clients_accounts(alice, bob):
    for url in (
        f"/api/v1/accounts/{bob.account.pk}",
        f"/api/v1/accounts/{bob.account.pk}/transactions",
    ):
        error(alice.api.get(url), 404, "not_found")
    error(alice.schedule(from_account_id=bob.account.pk), 404, "not_found")
    assert Payment.objects.count() == 0
