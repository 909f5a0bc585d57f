"""Idempotency-Key with Stripe's semantics, including 20 concurrent requests on PostgreSQL."""

import json
import threading
import time
from datetime import timedelta

import pytest
import time_machine
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone
from rest_framework.test import APIClient

from ledger.models import Account, Hold
from payments import idempotency, services
from payments.exceptions import IdempotencyClaimLost
from payments.idempotency import (
    idempotency_begin,
    idempotency_complete,
    idempotency_purge_expired,
    idempotency_release,
    request_fingerprint,
)
from payments.models import IdempotencyKey, IdempotencyStatus, Payment
from tests.concurrency import run_in_threads
from tests.payments.test_api import error

SCHEDULE = "/api/v1/payments/schedule"


def schedule_body(client, **overrides) -> dict:
    return {
        "from_account_id": client.account.pk,
        "to_account_id": client.other_account.pk,
        "amount": 100,
        "delay_seconds": 60,
    } | overrides


def expired_keys(client, ttl_seconds: int, ages) -> None:
    """Completed keys ``k<age>`` of ``client``, each ``age`` minutes past the TTL."""
    now = timezone.now()
    ttl = timedelta(seconds=ttl_seconds)
    IdempotencyKey.objects.bulk_create(
        IdempotencyKey(
            client=client.user,
            key=f"k{age}",
            fingerprint="f",
            status=IdempotencyStatus.COMPLETED,
            locked_at=now - ttl - timedelta(minutes=age),
            created_at=now - ttl - timedelta(minutes=age),
        )
        for age in ages
    )


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
        refused = error(
            alice.schedule(amount=101, headers={"Idempotency-Key": "k2"}),
            422,
            "idempotency_key_reused",
        )
        assert refused["message"] == (
            "This Idempotency-Key was already used with a different request."
        )
        assert refused["details"] == {"key": "k2"}
        assert Payment.objects.count() == 1

    def test_same_body_with_keys_in_another_order_is_the_same_request(self, alice):
        """The fingerprint is of the JSON's meaning, not of its key order."""
        body = schedule_body(alice)
        headers = {"Idempotency-Key": "ordered"}
        first = alice.api.post(
            SCHEDULE, json.dumps(body), content_type="application/json", headers=headers
        )
        reordered = json.dumps(dict(reversed(body.items())))
        again = alice.api.post(
            SCHEDULE, reordered, content_type="application/json", headers=headers
        )
        assert first.status_code == again.status_code == 201
        assert again["Idempotent-Replayed"] == "true"
        assert Payment.objects.count() == 1

    @pytest.mark.parametrize(
        "media_type",
        ["Application/JSON", "APPLICATION/JSON; charset=utf-8", "application/*", "*/*"],
    )
    def test_another_body_under_any_spelling_of_json_is_refused(self, alice, media_type):
        """The parser takes any spelling of the media type it parses (a review,
        session 42): the fingerprint covers what it parsed. Checking the raw
        header for ``application/json`` left these bodies out, and the same key
        with amount 9,000 replayed the first answer (amount 100) as if done."""
        headers = {"Idempotency-Key": "spelled"}
        first = alice.api.post(
            SCHEDULE, json.dumps(schedule_body(alice)), content_type=media_type, headers=headers
        )
        assert first.status_code == 201, first.content
        other = json.dumps(schedule_body(alice, amount=9_000))
        refused = alice.api.post(SCHEDULE, other, content_type=media_type, headers=headers)
        error(refused, 422, "idempotency_key_reused")
        same = json.dumps(schedule_body(alice))
        again = alice.api.post(SCHEDULE, same, content_type=media_type, headers=headers)
        assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
        assert list(Payment.objects.values_list("amount", flat=True)) == [100]

    def test_a_key_stored_before_the_parsed_body_rule_still_replays(self, alice):
        """A retry across the deploy of a body sent as ``Application/JSON`` (stored
        then under the no-body fingerprint) replays instead of answering 422 — a
        client told 422 may retry under a fresh key and pay twice (a review,
        session 42)."""
        body = schedule_body(alice)
        now = timezone.now()
        IdempotencyKey.objects.create(
            client=alice.user,
            key="before-deploy",
            fingerprint=request_fingerprint("POST", SCHEDULE, None),
            status=IdempotencyStatus.COMPLETED,
            response_status=201,
            response_body={"payment_id": "stored"},
            locked_at=now,
            created_at=now,
        )
        again = alice.api.post(
            SCHEDULE,
            json.dumps(body),
            content_type="Application/JSON",
            headers={"Idempotency-Key": "before-deploy"},
        )
        assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
        assert again.json() == {"payment_id": "stored"} and not Payment.objects.exists()

    def test_a_bodyless_request_keeps_the_fingerprint_it_had(self):
        """Keys stored before the parsed-body rule stay replayable: a request
        without a body is fingerprinted with no body, as it always was."""
        from rest_framework.request import Request
        from rest_framework.test import APIRequestFactory

        from payments.api.parsers import JSONParser
        from payments.api.views import _fingerprinted

        request = Request(APIRequestFactory().delete("/x"), parsers=[JSONParser()])
        assert _fingerprinted(request) is None
        form = APIRequestFactory().post(
            "/x", "a=1", content_type="application/x-www-form-urlencoded"
        )
        assert _fingerprinted(Request(form, parsers=[JSONParser()])) is None

    def test_key_is_scoped_to_the_client(self, alice, bob):
        assert alice.schedule(headers={"Idempotency-Key": "shared"}).status_code == 201
        response = bob.schedule(headers={"Idempotency-Key": "shared"})
        assert response.status_code == 201 and "Idempotent-Replayed" not in response
        assert Payment.objects.count() == 2

    def test_a_replay_reads_the_clients_own_key_when_another_used_it_first(self, alice, bob):
        """The read after a lost insert is scoped to the client: bob's earlier row
        with the same key is neither replayed to alice nor taken for a reuse."""
        bobs = bob.schedule(headers={"Idempotency-Key": "shared"})
        alices = alice.schedule(headers={"Idempotency-Key": "shared"})
        again = alice.schedule(headers={"Idempotency-Key": "shared"})
        assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
        assert again.json() == alices.json() != bobs.json()
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
        busy = error(
            alice.schedule(headers={"Idempotency-Key": "busy"}), 409, "idempotency_key_in_use"
        )
        assert busy["message"] == (
            "A request with this Idempotency-Key is in progress; retry later."
        )
        assert busy["details"] == {"key": "busy"}
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

    def test_key_used_on_one_payment_is_refused_on_another(self, alice):
        """The fingerprint covers the path: cancelling payment B with the key that
        cancelled A is a different request (422), not a replay of A's success."""
        a = alice.schedule(amount=100).json()["payment_id"]
        b = alice.schedule(amount=200).json()["payment_id"]
        first = alice.api.delete(f"/api/v1/payments/{a}/cancel", headers={"Idempotency-Key": "k"})
        assert first.status_code == 200 and first.json()["payment"]["payment_id"] == a
        err = error(
            alice.api.delete(f"/api/v1/payments/{b}/cancel", headers={"Idempotency-Key": "k"}),
            422,
            "idempotency_key_reused",
        )
        assert err["details"] == {"key": "k"}
        payment = Payment.objects.get(pk=b)
        assert payment.status == "PENDING" and payment.hold.status == "active"
        assert Account.objects.get(pk=alice.account.pk).held == 200
        assert not payment.events.filter(type="cancelled").exists()

    def test_key_used_with_one_method_is_refused_with_another(self, alice):
        """The fingerprint covers the method: the same path and (empty) body under
        another method is a different request."""
        pid = alice.schedule().json()["payment_id"]
        url = f"/api/v1/payments/{pid}/cancel"
        assert alice.api.delete(url, headers={"Idempotency-Key": "m"}).status_code == 200
        error(alice.api.post(url, headers={"Idempotency-Key": "m"}), 422, "idempotency_key_reused")
        replay = alice.api.delete(url, headers={"Idempotency-Key": "m"})
        assert replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"

    def test_unexpected_error_frees_the_key_for_a_retry(self, alice, monkeypatch):
        """A 500 after the service wrote its rows: the writes roll back with the
        request and the key is released, so the client's retry with the same key
        is executed (201, not replayed, not 409 in use)."""
        from payments import services

        real_schedule = services.payment_schedule
        crashes = []

        def schedule_then_crash(**kwargs):
            payment = real_schedule(**kwargs)
            if not crashes:
                crashes.append(payment.pk)
                raise RuntimeError("crash after the work, before the response is stored")
            return payment

        monkeypatch.setattr(services, "payment_schedule", schedule_then_crash)
        crashed = alice.schedule(headers={"Idempotency-Key": "retry-me"})
        error(crashed, 500, "internal_error")
        assert crashes and not Payment.objects.filter(pk=crashes[0]).exists()
        assert Payment.objects.count() == 0 and Hold.objects.count() == 0
        retried = alice.schedule(headers={"Idempotency-Key": "retry-me"})
        assert retried.status_code == 201, retried.content  # not 409 idempotency_key_in_use
        assert "Idempotent-Replayed" not in retried
        assert Payment.objects.count() == 1
        assert Account.objects.get(pk=alice.account.pk).held == 100
        again = alice.schedule(headers={"Idempotency-Key": "retry-me"})
        assert again["Idempotent-Replayed"] == "true" and again.json() == retried.json()

    def test_key_is_honoured_for_its_whole_ttl(self, alice, settings):
        with time_machine.travel(timezone.now(), tick=False) as clock:
            first = alice.schedule(headers={"Idempotency-Key": "day"})
            clock.shift(timedelta(seconds=settings.IDEMPOTENCY_TTL_SECONDS))
            again = alice.schedule(headers={"Idempotency-Key": "day"})
            assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
            assert again.json() == first.json()
            clock.shift(timedelta(microseconds=1))
            fresh = alice.schedule(headers={"Idempotency-Key": "day"})
            assert fresh.status_code == 201 and "Idempotent-Replayed" not in fresh
        assert Payment.objects.count() == 2

    def test_in_flight_claim_is_taken_over_only_after_the_timeout(self, alice, settings):
        fingerprint = request_fingerprint("POST", SCHEDULE, schedule_body(alice))
        with time_machine.travel(timezone.now(), tick=False) as clock:
            idempotency_begin(client=alice.user, key="slow", fingerprint=fingerprint)
            clock.shift(timedelta(seconds=settings.IDEMPOTENCY_IN_FLIGHT_TIMEOUT))
            error(
                alice.schedule(headers={"Idempotency-Key": "slow"}), 409, "idempotency_key_in_use"
            )
            clock.shift(timedelta(microseconds=1))
            taken_over = alice.schedule(headers={"Idempotency-Key": "slow"})
            assert taken_over.status_code == 201 and "Idempotent-Replayed" not in taken_over
        record = IdempotencyKey.objects.get(key="slow")
        assert record.status == IdempotencyStatus.COMPLETED
        assert record.response_body == taken_over.json()
        assert Payment.objects.count() == 1

    def test_a_claim_taken_over_belongs_to_the_retry_alone(self, alice, settings):
        """The first request outlived its claim and a retry took it over: the first
        can neither store its answer (its transaction must roll back) nor free the
        key under the retry."""
        with time_machine.travel(timezone.now(), tick=False) as clock:
            first = idempotency_begin(client=alice.user, key="slow", fingerprint="f")
            clock.shift(timedelta(seconds=settings.IDEMPOTENCY_IN_FLIGHT_TIMEOUT, microseconds=1))
            retry = idempotency_begin(client=alice.user, key="slow", fingerprint="f")
        assert retry.replay is False and retry.record.pk == first.record.pk
        idempotency_release(record=first.record)
        with pytest.raises(IdempotencyClaimLost) as lost:
            idempotency_complete(record=first.record, status=201, body={"from": "first"})
        assert lost.value.code == "idempotency_key_in_use"
        assert str(lost.value) == "A request with this Idempotency-Key is in progress; retry later."
        assert lost.value.details == {"key": "slow"}
        record = IdempotencyKey.objects.get(key="slow")
        assert (record.status, record.response_body) == (IdempotencyStatus.IN_FLIGHT, None)
        idempotency_complete(record=retry.record, status=201, body={"from": "retry"})
        assert (retry.record.status, retry.record.response_status) == ("completed", 201)
        assert retry.record.response_body == {"from": "retry"}
        record.refresh_from_db()
        assert (record.status, record.response_body) == (
            IdempotencyStatus.COMPLETED,
            {"from": "retry"},
        )
        idempotency_release(record=retry.record)  # completed: nothing to free
        assert IdempotencyKey.objects.filter(key="slow").exists()

    def test_an_unexpected_error_frees_the_key_for_a_retry(self, alice, bob, monkeypatch):
        real_schedule = services.payment_schedule
        others = [
            idempotency_begin(client=bob.user, key="retry-me", fingerprint="f"),
            idempotency_begin(client=alice.user, key="another", fingerprint="f"),
        ]

        def broken(**kwargs):
            raise RuntimeError("a bug, not a business rule")

        monkeypatch.setattr(services, "payment_schedule", broken)
        api = APIClient(raise_request_exception=False)
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {alice.token}")
        headers = {"Idempotency-Key": "retry-me"}
        crashed = api.post(SCHEDULE, schedule_body(alice), format="json", headers=headers)
        assert crashed.status_code == 500
        # only this request's claim is freed, not the client's or anyone else's
        left = IdempotencyKey.objects.values_list("pk", flat=True)
        assert sorted(left) == sorted(claim.record.pk for claim in others)

        monkeypatch.setattr(services, "payment_schedule", real_schedule)
        retried = api.post(SCHEDULE, schedule_body(alice), format="json", headers=headers)
        assert retried.status_code == 201 and "Idempotent-Replayed" not in retried
        assert Payment.objects.count() == 1

    def test_a_crash_after_a_takeover_does_not_free_the_completed_key(self, alice):
        """Request A's claim went stale, B took it over and answered; A then
        crashes. The key stays B's: a retry replays B's answer."""
        stale = idempotency_begin(client=alice.user, key="k", fingerprint="f")
        IdempotencyKey.objects.filter(pk=stale.record.pk).update(
            status=IdempotencyStatus.COMPLETED, response_status=201, response_body={"b": 1}
        )
        idempotency_release(record=stale.record)
        again = idempotency_begin(client=alice.user, key="k", fingerprint="f")
        assert again.replay is True and again.record.response_body == {"b": 1}

    def test_inserts_that_keep_losing_races_answer_409(self, alice, monkeypatch):
        """The key's row is inserted by another request and gone again before it
        can be read, twice: the INSERT reports a conflict, the locked read finds
        nothing."""
        real_insert = idempotency._insert_in_flight
        attempts = []

        def loses_twice(record):  # a third round would claim the key
            attempts.append(record.key)
            return len(attempts) > 2 and real_insert(record)

        monkeypatch.setattr(idempotency, "_insert_in_flight", loses_twice)
        busy = error(
            alice.schedule(headers={"Idempotency-Key": "unlucky"}), 409, "idempotency_key_in_use"
        )
        assert busy["message"] == "A request with this Idempotency-Key is in progress."
        assert busy["details"] == {"key": "unlucky"}
        assert attempts == ["unlucky", "unlucky"]  # two rounds, then the client retries
        assert Payment.objects.count() == 0 and IdempotencyKey.objects.count() == 0

    def test_a_key_released_between_insert_and_read_is_claimed_on_the_second_try(
        self, alice, monkeypatch
    ):
        real_insert = idempotency._insert_in_flight
        attempts = []

        def first_sees_a_conflict(record):
            attempts.append(record.key)
            return len(attempts) > 1 and real_insert(record)

        monkeypatch.setattr(idempotency, "_insert_in_flight", first_sees_a_conflict)
        response = alice.schedule(headers={"Idempotency-Key": "second-try"})
        assert response.status_code == 201 and "Idempotent-Replayed" not in response
        assert attempts == ["second-try", "second-try"]
        record = IdempotencyKey.objects.get(key="second-try")
        assert (record.status, record.response_status) == (IdempotencyStatus.COMPLETED, 201)
        assert record.response_body == response.json()

    def test_a_new_key_is_claimed_with_one_statement(self, alice, django_assert_num_queries):
        """No transaction and no locked read of its own for a key never seen."""
        with django_assert_num_queries(1):
            claim = idempotency_begin(client=alice.user, key="fresh", fingerprint="f")
        assert claim.replay is False and claim.record.pk is not None
        record = IdempotencyKey.objects.get(pk=claim.record.pk)
        assert (record.client_id, record.key, record.fingerprint, record.status) == (
            alice.user.pk,
            "fresh",
            "f",
            IdempotencyStatus.IN_FLIGHT,
        )
        assert record.locked_at == record.created_at == claim.record.locked_at
        assert (record.response_status, record.response_body) == (None, None)
        # The claim is a saved row: completing it updates that row.
        idempotency_complete(record=claim.record, status=201, body={"ok": True})
        assert IdempotencyKey.objects.get(pk=record.pk).response_body == {"ok": True}

    def test_each_of_a_clients_keys_replays_its_own_response(self, alice):
        """The read after a lost insert looks up this key, not any of the client's."""
        first = alice.schedule(amount=100, headers={"Idempotency-Key": "first"})
        second = alice.schedule(amount=200, headers={"Idempotency-Key": "second"})
        for key, original in (("second", second), ("first", first)):
            amount = original.json()["amount"]
            again = alice.schedule(amount=amount, headers={"Idempotency-Key": key})
            assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
            assert again.json() == original.json()
        assert Payment.objects.count() == 2

    def test_a_new_claim_passes_the_models_own_validation(self, alice):
        """The inserted claim is a saved instance: unique (client, key) is not its own clash."""
        claim = idempotency_begin(client=alice.user, key="valid", fingerprint="f")
        claim.record.validate_constraints()
        duplicate = IdempotencyKey(
            client=alice.user, key="valid", fingerprint="f", status=IdempotencyStatus.IN_FLIGHT
        )
        with pytest.raises(ValidationError):
            duplicate.validate_constraints()

    def test_completing_one_claim_leaves_claims_of_the_same_instant_alone(self, alice, bob):
        with time_machine.travel(timezone.now(), tick=False):
            mine = idempotency_begin(client=alice.user, key="k", fingerprint="f")
            others = [
                idempotency_begin(client=alice.user, key="other", fingerprint="f"),
                idempotency_begin(client=bob.user, key="k", fingerprint="f"),
            ]
        assert {o.record.locked_at for o in others} == {mine.record.locked_at}
        idempotency_complete(record=mine.record, status=201, body={"ok": True})
        idempotency_release(record=others[0].record)
        statuses = dict(IdempotencyKey.objects.values_list("pk", "status"))
        assert statuses == {mine.record.pk: "completed", others[1].record.pk: "in_flight"}

    def test_completing_after_a_takeover_writes_nothing(self, alice):
        """Completion must not undo a takeover that happened meanwhile: it is refused
        (its transaction rolls back) and the row stays as the takeover wrote it."""
        claim = idempotency_begin(client=alice.user, key="k", fingerprint="f")
        later = claim.record.locked_at + timedelta(minutes=5)
        IdempotencyKey.objects.filter(pk=claim.record.pk).update(
            locked_at=later, created_at=later, fingerprint="g"
        )
        with pytest.raises(IdempotencyClaimLost):
            idempotency_complete(record=claim.record, status=201, body={"ok": True})
        record = IdempotencyKey.objects.get(pk=claim.record.pk)
        assert (record.status, record.response_status, record.response_body) == (
            IdempotencyStatus.IN_FLIGHT,
            None,
            None,
        )
        assert (record.locked_at, record.created_at, record.fingerprint) == (later, later, "g")

    def test_purge_deletes_only_expired_keys(self, alice, bob, settings):
        now = timezone.now()
        ttl = timedelta(seconds=settings.IDEMPOTENCY_TTL_SECONDS)
        for client, key, age in (
            (alice, "expired", ttl + timedelta(seconds=1)),
            (bob, "expired-too", ttl + timedelta(days=3)),
            (alice, "kept", ttl - timedelta(seconds=1)),
            (bob, "new", timedelta(0)),
        ):
            IdempotencyKey.objects.create(
                client=client.user,
                key=key,
                fingerprint="f",
                status=IdempotencyStatus.COMPLETED,
                locked_at=now - age,
                created_at=now - age,
            )
        assert idempotency_purge_expired() == 2
        assert sorted(IdempotencyKey.objects.values_list("key", flat=True)) == ["kept", "new"]

    def test_purge_is_bounded_per_run_oldest_first_and_the_next_run_goes_on(
        self, alice, settings, monkeypatch
    ):
        """DESIGN §8: one DELETE of every expired key held the worker it shares with
        the materialiser for as long as the backlog took; now ``batch`` keys a
        transaction, oldest first, until the run's time is up."""
        expired_keys(alice, settings.IDEMPOTENCY_TTL_SECONDS, range(1, 8))
        clock = iter(range(100))  # one second a reading: room for two batches
        monkeypatch.setattr(idempotency.time, "monotonic", lambda: next(clock))
        assert idempotency_purge_expired(batch=2, budget_seconds=2.5) == 4
        left = sorted(IdempotencyKey.objects.values_list("key", flat=True))
        assert left == ["k1", "k2", "k3"]  # the oldest went first
        assert idempotency_purge_expired(batch=2, budget_seconds=10) == 3  # a short batch ends it
        assert not IdempotencyKey.objects.exists()

    def test_purge_starts_no_batch_once_its_time_is_up(self, alice, settings, monkeypatch):
        expired_keys(alice, settings.IDEMPOTENCY_TTL_SECONDS, range(1, 8))
        clock = iter(range(100))  # one second a reading: the deadline is read at 2
        monkeypatch.setattr(idempotency.time, "monotonic", lambda: next(clock))
        assert idempotency_purge_expired(batch=2, budget_seconds=2) == 2

    def test_purge_runs_the_documented_batches_and_time(self, alice, settings, monkeypatch):
        """README: "5,000 a transaction, at most 5 s a run" (by behaviour: mutation
        testing wraps the function, so its signature would not show a changed default)."""
        expired_keys(alice, settings.IDEMPOTENCY_TTL_SECONDS, range(1, 5002))
        # the deadline read at 0, the first batch at 4 s, the next look at 5 s: one batch
        clock = iter([0, 4, 5, 6, 7])
        monkeypatch.setattr(idempotency.time, "monotonic", lambda: next(clock))
        assert idempotency_purge_expired() == 5000

    def test_key_length(self, alice):
        error(alice.schedule(headers={"Idempotency-Key": "x" * 256}), 400, "validation_error")

    @pytest.mark.parametrize("key", ["a\x00b", "tab\there", "caf\u00e9", "\x7f"])
    def test_a_key_is_printable_ascii(self, alice, key):
        """A NUL reached PostgreSQL (a 500 under runserver, which passes it on)."""
        body = error(alice.schedule(headers={"Idempotency-Key": key}), 400, "validation_error")
        assert body["details"]["fields"]["Idempotency-Key"] == [
            "1 to 255 printable ASCII characters"
        ]
        assert not IdempotencyKey.objects.exists() and not Payment.objects.exists()
        ok = alice.schedule(headers={"Idempotency-Key": " ~!#key-2026-11 "})
        assert ok.status_code == 201


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


@pytest.mark.postgres  # SQLite has one writer: the loser cannot insert inside the winner's write
@pytest.mark.django_db(transaction=True)
def test_losing_the_insert_race_reads_the_winners_key(alice):
    """Two requests insert one key at once: the loser's INSERT waits for the
    winner's transaction, then reports the conflict (no error), and the loser
    answers from the winner's row (here: replays it)."""
    fingerprint = request_fingerprint("POST", SCHEDULE, schedule_body(alice))
    inserted = threading.Event()

    def winner():
        try:
            with transaction.atomic():
                IdempotencyKey.objects.create(
                    client=alice.user,
                    key="raced",
                    fingerprint=fingerprint,
                    status=IdempotencyStatus.COMPLETED,
                    response_status=201,
                    response_body={"from": "the winner"},
                    locked_at=timezone.now(),
                    created_at=timezone.now(),
                )
                inserted.set()
                time.sleep(0.5)  # the loser's INSERT is waiting on this row meanwhile
        finally:
            connection.close()

    thread = threading.Thread(target=winner)
    thread.start()
    assert inserted.wait(30)
    claim = idempotency_begin(client=alice.user, key="raced", fingerprint=fingerprint)
    thread.join(30)
    assert claim.replay is True
    assert claim.record.response_body == {"from": "the winner"}
    assert IdempotencyKey.objects.filter(key="raced").count() == 1


@pytest.mark.postgres  # SQLite has one writer: the retry would wait for the slow request
@pytest.mark.django_db(transaction=True)
def test_a_request_still_running_when_a_retry_takes_over_its_key_is_rolled_back(
    alice, settings, monkeypatch
):
    """One key, one payment: a request slower than IDEMPOTENCY_IN_FLIGHT_TIMEOUT
    (here 0: any claim is stale at once) is taken over by the client's retry,
    which schedules the payment; the slow one then rolls its payment back and
    answers 409, and the key replays the retry's answer."""
    settings.IDEMPOTENCY_IN_FLIGHT_TIMEOUT = 0
    real_schedule = services.payment_schedule
    inside, retried = threading.Event(), threading.Event()
    slow_thread = []

    def schedule(**kwargs):
        if threading.current_thread() in slow_thread:
            inside.set()
            assert retried.wait(30)
        return real_schedule(**kwargs)

    monkeypatch.setattr(services, "payment_schedule", schedule)
    headers = {"Idempotency-Key": "slow"}
    answers = {}

    def slow_request():
        try:
            api = APIClient()
            api.credentials(HTTP_AUTHORIZATION=f"Bearer {alice.token}")
            answers["slow"] = api.post(
                SCHEDULE, schedule_body(alice), format="json", headers=headers
            )
        finally:
            connection.close()

    thread = threading.Thread(target=slow_request)
    slow_thread.append(thread)
    thread.start()
    try:
        assert inside.wait(30)
        retry = alice.schedule(headers=headers)
    finally:
        retried.set()
        thread.join(30)
    assert retry.status_code == 201 and "Idempotent-Replayed" not in retry
    error(answers["slow"], 409, "idempotency_key_in_use")
    assert [str(pk) for pk in Payment.objects.values_list("pk", flat=True)] == [
        retry.json()["payment_id"]
    ]
    assert Account.objects.get(pk=alice.account.pk).held == 100
    settings.IDEMPOTENCY_IN_FLIGHT_TIMEOUT = 60
    again = alice.schedule(headers=headers)
    assert again["Idempotent-Replayed"] == "true" and again.json() == retry.json()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_key_reused_while_the_purge_runs_is_not_purged(alice, settings, monkeypatch):
    """The purge reads a batch of expired ids, then deletes them: a key the client
    reused in between (a new created_at on the same row) and completed was deleted
    with them, so the client's retry found nothing and ran its request again — a
    second payment (a reviewer's probe). The delete checks the age again. (SQLite's
    write transactions take the database's one write lock at BEGIN: nothing can
    come in between there.)"""
    import threading

    from django.db import connection

    from payments.idempotency import idempotency_begin, idempotency_complete

    old = timezone.now() - timedelta(seconds=settings.IDEMPOTENCY_TTL_SECONDS + 60)
    IdempotencyKey.objects.create(
        client=alice.user,
        key="K",
        fingerprint="f1",
        status=IdempotencyStatus.COMPLETED,
        locked_at=old,
        created_at=old,
        response_status=201,
        response_body={"x": 1},
    )
    real = idempotency.IdempotencyKey.objects.filter

    def filter_(*args, **kwargs):
        if "pk__in" in kwargs:  # between the batch's read and its delete: the key reused

            def reuse():
                try:
                    claim = idempotency_begin(client=alice.user, key="K", fingerprint="f2")
                    assert not claim.replay
                    idempotency_complete(record=claim.record, status=201, body={"y": 2})
                finally:
                    connection.close()

            thread = threading.Thread(target=reuse)
            thread.start()
            thread.join(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(idempotency.IdempotencyKey.objects, "filter", filter_)
    assert idempotency_purge_expired() == 0
    monkeypatch.undo()
    retry = idempotency_begin(client=alice.user, key="K", fingerprint="f2")
    assert retry.replay and retry.record.response_body == {"y": 2}
