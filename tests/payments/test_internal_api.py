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


def _reaper_runs_before_the_executor_locks(monkeypatch):
    """A beat tick of the lease reaper between execute-now's claim (committed) and
    its execution (a transaction of its own)."""
    from payments.engine import executor, reaper

    real = executor.execute_chunk

    def reaped_first(items, **kwargs):
        reaper.reap_leases()
        return real(items, **kwargs)

    monkeypatch.setattr(executor, "execute_chunk", reaped_first)


def test_execute_now_is_not_undone_by_the_reaper_in_its_window(alice, monkeypatch):
    """The claim's lease was already over: the reaper put the payment back to PENDING
    (new fence) and the execution found it stale — 200 PENDING, nothing run (a
    reviewer's finding)."""
    from payments import services

    (pid,) = schedule(alice, amount=40)
    make_due(pid)
    _reaper_runs_before_the_executor_locks(monkeypatch)
    payment = services.payment_execute_now(payment_id=pid, execution_id="op-1")
    assert payment.status == "COMPLETED", (payment.status, payment.error_code)
    assert JournalEntry.objects.filter(reference=f"payment:{pid}").count() == 1


def test_execute_now_of_a_payment_on_its_last_attempt_runs_it(alice, monkeypatch, settings):
    """On its last attempt the reaper dead-lettered it untried: FAILED
    max_attempts_exceeded, "Not executed after 5 attempts."."""
    from payments import services
    from payments.models import Payment

    (pid,) = schedule(alice, amount=40)
    make_due(pid)
    Payment.objects.filter(pk=pid).update(attempts=settings.PAYMENT_MAX_ATTEMPTS - 1)
    _reaper_runs_before_the_executor_locks(monkeypatch)
    payment = services.payment_execute_now(payment_id=pid, execution_id="op-2")
    assert (payment.status, payment.error_code) == ("COMPLETED", "")
    assert JournalEntry.objects.filter(reference=f"payment:{pid}").count() == 1
