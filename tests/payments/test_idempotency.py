"""Idempotency-Key with Stripe's semantics, including 20 concurrent requests on PostgreSQL."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from ledger.models import Account, Hold
from payments.models import IdempotencyKey, IdempotencyStatus, Payment
from tests.concurrency import run_in_threads
from tests.payments.test_api import error


@pytest.mark.django_db
class TestSemantics:
    def test_same_key_same_request_replays_first_response(self, alice):
        first = alice.schedule(headers={"Idempotency-Key": "k1"})
        assert first.status_code == 201 and "Idempotent-Replayed" not in first
        again = alice.schedule(headers={"Idempotency-Key": "k1"})
        assert again.status_code == 201
        assert again["Idempotent-Replayed"] == "true"
        assert again.json() == first.json()
        assert Payment.objects.count() == 1
        assert Account.objects.get(pk=alice.account.pk).held == 100

    def test_same_key_different_request_is_refused(self, alice):
        alice.schedule(headers={"Idempotency-Key": "k2"})
        error(
            alice.schedule(amount=101, headers={"Idempotency-Key": "k2"}),
            422,
            "idempotency_key_reused",
        )
        assert Payment.objects.count() == 1

    def test_key_is_scoped_to_the_client(self, alice, bob):
        assert alice.schedule(headers={"Idempotency-Key": "shared"}).status_code == 201
        response = bob.schedule(headers={"Idempotency-Key": "shared"})
        assert response.status_code == 201 and "Idempotent-Replayed" not in response
        assert Payment.objects.count() == 2

    def test_in_flight_key_is_409(self, alice):
        now = timezone.now()
        IdempotencyKey.objects.create(
            client=alice.user,
            key="busy",
            fingerprint="whatever",
            status=IdempotencyStatus.IN_FLIGHT,
            locked_at=now,
            created_at=now,
        )
        # a different body would be 422; same-fingerprint in-flight is 409
        record = IdempotencyKey.objects.get(key="busy")
        from payments.idempotency import request_fingerprint

        body = {
            "from_account_id": alice.account.pk,
            "to_account_id": alice.other_account.pk,
            "amount": 100,
            "delay_seconds": 60,
        }
        record.fingerprint = request_fingerprint("POST", "/api/v1/payments/schedule", body)
        record.save()
        error(alice.schedule(headers={"Idempotency-Key": "busy"}), 409, "idempotency_key_in_use")
        # a claim whose process died long ago is taken over
        IdempotencyKey.objects.filter(pk=record.pk).update(locked_at=now - timedelta(minutes=5))
        assert alice.schedule(headers={"Idempotency-Key": "busy"}).status_code == 201

    def test_refusals_are_replayed_too(self, alice):
        first = alice.schedule(amount=20_000, headers={"Idempotency-Key": "poor"})
        error(first, 422, "insufficient_funds")
        again = alice.schedule(amount=20_000, headers={"Idempotency-Key": "poor"})
        assert again.status_code == 422 and again["Idempotent-Replayed"] == "true"
        assert Payment.objects.count() == 0 and Hold.objects.count() == 0

    def test_expired_key_starts_afresh(self, alice):
        alice.schedule(headers={"Idempotency-Key": "old"})
        IdempotencyKey.objects.filter(key="old").update(
            created_at=timezone.now() - timedelta(hours=25)
        )
        response = alice.schedule(headers={"Idempotency-Key": "old"})
        assert response.status_code == 201 and "Idempotent-Replayed" not in response
        assert Payment.objects.count() == 2

    def test_cancel_with_key_replays_success(self, alice):
        payment_id = alice.schedule().json()["payment_id"]
        url = f"/api/v1/payments/{payment_id}/cancel"
        first = alice.api.delete(url, headers={"Idempotency-Key": "c1"})
        again = alice.api.delete(url, headers={"Idempotency-Key": "c1"})
        assert first.status_code == again.status_code == 200
        assert again["Idempotent-Replayed"] == "true"
        error(
            alice.api.delete(url, headers={"Idempotency-Key": "c2"}), 409, "payment_not_cancellable"
        )

    def test_key_length(self, alice):
        error(alice.schedule(headers={"Idempotency-Key": "x" * 256}), 400, "validation_error")


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_requests_with_one_key(alice):
    body = {
        "from_account_id": alice.account.pk,
        "to_account_id": alice.other_account.pk,
        "amount": 700,
        "delay_seconds": 600,
    }
    token = alice.token
    results: list[tuple[int, str | None]] = []

    def request(_):
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        response = api.post(
            "/api/v1/payments/schedule", body, format="json", headers={"Idempotency-Key": "race"}
        )
        code = response.json().get("error", {}).get("code") if response.status_code >= 400 else None
        results.append((response.status_code, response.get("Idempotent-Replayed"), code))

    assert run_in_threads(request, 20) == []
    assert len(results) == 20
    fresh = [r for r in results if r[0] == 201 and r[1] is None]
    assert len(fresh) == 1
    for status, replayed, code in results:
        if (status, replayed) == (201, None):
            continue
        assert (status, replayed) == (201, "true") or (status, code) == (
            409,
            "idempotency_key_in_use",
        )
    assert Payment.objects.count() == 1
    assert Hold.objects.filter(account=alice.account).count() == 1
    assert Account.objects.get(pk=alice.account.pk).held == 700
