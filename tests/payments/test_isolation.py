"""Two clients: every path with the other's payment id is 404, and nothing changes."""

import uuid

import pytest

from ledger import services as ledger
from ledger.models import Account, Hold
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


def test_a_payee_cannot_reach_a_payment_made_into_its_account(alice, bob):
    """Bob owns the destination, not the source: alice's payment to him is not his
    to read, list, change, cancel or audit — 404 on every path, before and after
    it executes (README: a client sees only payments from accounts it owns)."""
    from payments.engine import executor
    from tests.payments.helpers import make_due

    pending = alice.schedule(to_account_id=bob.account.pk, amount=300).json()["payment_id"]
    done = alice.schedule(to_account_id=bob.account.pk, amount=200).json()["payment_id"]
    make_due(done)
    executor.execute_chunk(_claims_of(done))
    assert Payment.objects.get(pk=done).status == "COMPLETED"
    assert Account.objects.get(pk=bob.account.pk).balance == 10_200  # he was paid
    before = snapshot()
    for payment_id in (pending, done):
        base = f"/api/v1/payments/{payment_id}"
        calls = [
            ("get", base, None),
            ("patch", base, {"amount": 1}),
            ("patch", base, {"delay_seconds": 10}),
            ("patch", base, {"description": "mine now"}),
            ("delete", f"{base}/cancel", None),
            ("post", f"{base}/cancel", {}),
            ("get", f"{base}/events", None),
            ("get", f"{base}/attempts", None),
        ]
        for method, url, body in calls:
            response = getattr(bob.api, method)(url, body, format="json")
            error(response, 404, "not_found")
    for params in (
        {},
        {"account_id": bob.account.pk},
        {"account_id": alice.account.pk},
        {"status": "PENDING"},
        {"status": "COMPLETED"},
    ):
        listing = bob.api.get("/api/v1/payments", params)
        assert listing.status_code == 200, (params, listing.content)
        assert listing.json()["payments"] == [], params
    assert snapshot() == before
    # the payer still sees both, and the pending one is still open
    assert alice.api.get(f"/api/v1/payments/{pending}").json()["status"] == "PENDING"
    assert {p["payment_id"] for p in alice.api.get("/api/v1/payments").json()["payments"]} == {
        pending,
        done,
    }


def _claims_of(*payment_ids):
    """Claim these payments as the sweeper would: (id, fence) pairs for the executor."""
    from django.db import transaction

    from tests.payments.helpers import claim_batch

    with transaction.atomic():
        claims = claim_batch(100)
    return [(c.payment_id, c.fence) for c in claims if c.payment_id in payment_ids]


def test_another_clients_payment_is_answered_like_one_that_does_not_exist(alice, bob):
    """Nothing in the 404 tells the two apart (the id is the one asked for)."""
    for payment_id in (bob.schedule().json()["payment_id"], str(uuid.uuid4())):
        err = error(alice.api.get(f"/api/v1/payments/{payment_id}"), 404, "not_found")
        assert err == {
            "code": "not_found",
            "message": f"Payment {payment_id} not found.",
            "details": {"payment_id": payment_id},
        }


def test_account_paths_hide_other_clients_accounts(alice, bob):
    for url in (
        f"/api/v1/accounts/{bob.account.pk}",
        f"/api/v1/accounts/{bob.account.pk}/transactions",
    ):
        error(alice.api.get(url), 404, "not_found")
    error(alice.schedule(from_account_id=bob.account.pk), 404, "not_found")
    assert Payment.objects.count() == 0


def _answer(response, account_id: int):
    """The error with the account id blanked out, for comparing refusals."""
    body = response.json()
    return response.status_code, str(body).replace(str(account_id), "N")


def test_every_destination_a_client_may_not_pay_gets_one_answer(alice, bob):
    """Unknown, system (issuance), another client's frozen or closed account:
    one identical refusal, so scheduling reveals nothing about any of them."""
    issuance = ledger.issuance_account()
    closed = ledger.account_create(owner=bob.user, name="closed")
    ledger.account_set_status(account_id=closed.pk, status="closed")
    ledger.account_set_status(account_id=bob.account.pk, status="frozen")
    unknown = Account.objects.order_by("-pk").first().pk + 1_000
    before = snapshot()
    answers = set()
    for account_id in (unknown, issuance.pk, bob.account.pk, closed.pk):
        response = alice.schedule(to_account_id=account_id)
        err = error(response, 422, "account_not_found")
        assert err["details"] == {"account_id": account_id}
        assert "frozen" not in str(err) and "closed" not in str(err)
        answers.add(_answer(response, account_id))
    assert len(answers) == 1, answers
    assert snapshot() == before and Hold.objects.count() == 0
    assert Account.objects.get(pk=issuance.pk).balance == -20_000  # two fixtures' deposits


def test_a_system_account_is_not_a_source(alice):
    """It has no owner, so it does not exist for any client: the unknown-account answer."""
    issuance = ledger.issuance_account()
    unknown = Account.objects.order_by("-pk").first().pk + 1_000
    before = snapshot()
    system = alice.schedule(from_account_id=issuance.pk, to_account_id=alice.account.pk)
    missing = alice.schedule(from_account_id=unknown, to_account_id=alice.account.pk)
    error(system, 404, "not_found")
    assert _answer(system, issuance.pk) == _answer(missing, unknown)
    assert snapshot() == before and Hold.objects.count() == 0


def _run_due(monkeypatch, *payment_ids):
    from payments.engine import executor
    from tests.payments.helpers import make_due, sweep

    make_due(*payment_ids)
    _, published = sweep(monkeypatch)
    executor.execute_chunk(published.items())


@pytest.mark.parametrize("status", ["frozen", "closed"])
def test_a_failed_payment_does_not_tell_another_clients_account_status(
    alice, bob, monkeypatch, status
):
    """Scheduling answers alike for another client's frozen, closed or unknown
    account; the outcome of a payment whose destination was frozen (or closed)
    after scheduling said "Account 7 is frozen." to the payer (a reviewer's
    finding). The payer's own account's status is theirs to know."""
    to_bob = alice.schedule(to_account_id=bob.account.pk).json()["payment_id"]
    to_own = alice.schedule().json()["payment_id"]
    # (a funded account cannot be closed through the service: written directly)
    Account.objects.filter(pk__in=[bob.account.pk, alice.other_account.pk]).update(status=status)
    _run_due(monkeypatch, to_bob, to_own)
    for path in ("", "/attempts", "/events"):
        body = alice.api.get(f"/api/v1/payments/{to_bob}{path}").content.decode()
        assert status not in body, (path, body)
    failed = alice.api.get(f"/api/v1/payments/{to_bob}").json()
    assert (failed["status"], failed["error_code"]) == ("FAILED", "account_not_active")
    assert failed["error_message"] == f"Account {bob.account.pk} is not active."
    own = alice.api.get(f"/api/v1/payments/{to_own}").json()
    assert own["error_message"] == f"Account {alice.other_account.pk} is {status}."
