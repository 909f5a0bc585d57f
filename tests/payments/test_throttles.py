"""The API throttles (payments/api/auth.py) against the suite's Redis cache: DRF's
sliding-window semantics, counted atomically on Redis's clock, one budget per
client; DRF's own path when the cache is not Redis."""

import logging
import threading
import time
from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth.models import AnonymousUser
from django.core.cache import cache, caches
from django.core.cache.backends.redis import RedisCache
from django.utils import timezone
from rest_framework.test import APIRequestFactory

from payments.api.auth import ClientRateThrottle, InternalRateThrottle

ACCOUNTS = "/api/v1/accounts"
TOLERANCE = 0.005  # s: the process's clock against Redis's (one host)


@pytest.fixture(autouse=True)
def _redis_cache():
    """These tests are about the Redis path: the suite's cache must be Redis."""
    assert isinstance(caches["default"], RedisCache)


def rate(monkeypatch, client: str, internal: str = "10/s") -> None:
    """DRF reads the rates at import; the throttles read them from the class."""
    monkeypatch.setattr(ClientRateThrottle, "THROTTLE_RATES", {"client": client})
    monkeypatch.setattr(InternalRateThrottle, "THROTTLE_RATES", {"internal": internal})


def throttled(response) -> int:
    """The 429's wait in whole seconds (DRF rounds it up); Retry-After says no less."""
    assert response.status_code == 429, response.content
    body = response.json()["error"]
    assert body["code"] == "throttled"
    wait = body["details"]["retry_after_seconds"]
    assert wait <= int(response["Retry-After"]) <= wait + 1
    return wait


def attempt(request) -> float | None:
    """What DRF does per request: a new throttle asks; its wait() if refused."""
    throttle = ClientRateThrottle()
    return None if throttle.allow_request(request, None) else throttle.wait()


def anonymous(address: str):
    request = APIRequestFactory().get(ACCOUNTS, REMOTE_ADDR=address)
    request.user = AnonymousUser()
    return request


@pytest.mark.django_db
def test_n_allowed_then_429_until_the_oldest_leaves_the_window(alice, monkeypatch):
    rate(monkeypatch, "3/min")
    for _ in range(3):
        assert alice.api.get(ACCOUNTS).status_code == 200
    for _ in range(2):
        # The first request leaves the 60 s window ~60 s after it was counted.
        assert throttled(alice.api.get(ACCOUNTS)) == 60


def test_the_window_slides_and_a_rejected_request_is_not_counted(monkeypatch):
    """3 per second. Two requests at 0, one at ~0.45 s, five refused after it, each
    told to wait until the first leaves the window. Just over 1 s after the
    first two, exactly two more fit: the first two left the window, the third
    has not (a fixed one-second window would allow three), and the five
    refusals took nothing (counted, they would leave room for none)."""
    rate(monkeypatch, "3/s")
    request = anonymous("203.0.113.7")
    first_sent = time.monotonic()
    assert attempt(request) is None
    first_done = time.monotonic()
    assert attempt(request) is None
    second_done = time.monotonic()
    time.sleep(0.45)
    third_sent = time.monotonic()
    assert attempt(request) is None
    third_done = time.monotonic()
    for _ in range(5):
        sent = time.monotonic()
        wait = attempt(request)
        done = time.monotonic()
        # first request's Redis time in [first_sent, first_done], this one's in [sent, done]
        assert first_sent + 1 - done - TOLERANCE <= wait <= first_done + 1 - sent + TOLERANCE
    time.sleep(max(0.0, second_done + 1.02 - time.monotonic()))
    assert attempt(request) is None
    assert attempt(request) is None
    sent = time.monotonic()
    wait = attempt(request)
    done = time.monotonic()
    assert done < third_sent + 1, "too slow a host for this test's timing"
    # refused until the third request leaves the window
    assert third_sent + 1 - done - TOLERANCE <= wait <= third_done + 1 - sent + TOLERANCE


@pytest.mark.django_db
def test_one_budget_per_user_whatever_the_address_and_per_address_when_anonymous(
    alice, bob, client, monkeypatch
):
    rate(monkeypatch, "3/min")
    for n in range(3):
        assert alice.api.get(ACCOUNTS, REMOTE_ADDR=f"192.0.2.{n}").status_code == 200
    throttled(alice.api.get(ACCOUNTS, REMOTE_ADDR="192.0.2.50"))  # by user, not by address
    assert bob.api.get(ACCOUNTS, REMOTE_ADDR="192.0.2.0").status_code == 200
    # Anonymous callers: one budget per address, not shared with alice's.
    for _ in range(3):
        assert client.get("/api/schema/", REMOTE_ADDR="192.0.2.0").status_code == 200
    assert client.get("/api/schema/", REMOTE_ADDR="192.0.2.0").status_code == 429
    assert client.get("/api/schema/", REMOTE_ADDR="198.51.100.1").status_code == 200


@pytest.mark.django_db
def test_the_count_lives_in_redis_under_the_cache_prefix_on_redis_time(alice, monkeypatch):
    """The process's clock does not move the window; ``cache.clear()`` (this
    cache's keys only) resets it; a DRF timestamp list an older process left
    under the client's cache key neither counts nor breaks the throttle."""
    rate(monkeypatch, "3/min")
    cache.set(f"throttle_client_{alice.user.pk}", [time.time()] * 3, 60)
    for _ in range(3):
        assert alice.api.get(ACCOUNTS).status_code == 200
    with time_machine.travel(timezone.now() + timedelta(minutes=2)):
        throttled(alice.api.get(ACCOUNTS))
    cache.clear()
    assert alice.api.get(ACCOUNTS).status_code == 200


def test_concurrent_requests_never_let_more_than_the_budget_through(monkeypatch, caplog):
    """Eight threads, one address, 25 tries each against a budget of 10: exactly
    10 allowed. DRF's GET-then-SET of the timestamp list lets threads read the
    same list and each append to its own copy, so more get through."""
    rate(monkeypatch, "10/min")
    request = anonymous("203.0.113.9")
    threads = 8
    start = threading.Barrier(threads)
    allowed: list[bool] = []

    def tries():
        start.wait()
        for _ in range(25):
            allowed.append(ClientRateThrottle().allow_request(request, None))

    workers = [threading.Thread(target=tries) for _ in range(threads)]
    with caplog.at_level(logging.WARNING, logger="payments.api.auth"):
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    # no request let through by the fail-open path
    assert not [r for r in caplog.records if r.name == "payments.api.auth"]
    assert len(allowed) == threads * 25
    assert allowed.count(True) == 10


@pytest.mark.django_db
def test_redis_down_lets_the_request_through_and_logs_a_warning(alice, settings, caplog):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: connection refused
    settings.CACHES = {
        "default": {
            "BACKEND": "scheduler_project.cache.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{port}/0",
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
        }
    }
    with caplog.at_level(logging.WARNING, logger="payments.api.auth"):
        response = alice.api.get(ACCOUNTS)
    assert response.status_code == 200, response.content
    [record] = [r for r in caplog.records if r.name == "payments.api.auth"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == "throttle cache unavailable; request allowed"


@pytest.mark.django_db
def test_a_cache_that_is_not_redis_still_throttles_with_drf(alice, bob, settings, monkeypatch):
    """The laptop default (file broker): a local-memory cache, DRF's own path."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    rate(monkeypatch, "3/min")
    for _ in range(3):
        assert alice.api.get(ACCOUNTS).status_code == 200
    assert throttled(alice.api.get(ACCOUNTS)) == 60
    assert bob.api.get(ACCOUNTS).status_code == 200
    history = caches["default"].get(f"throttle_client_{alice.user.pk}")
    assert len(history) == 3  # DRF's timestamp list, in the local cache


@pytest.mark.django_db
def test_internal_endpoint_budget_is_per_address_on_the_redis_path(client, settings, monkeypatch):
    settings.INTERNAL_API_TOKEN = "operator-secret"
    rate(monkeypatch, "100/s", internal="2/min")
    url = "/api/v1/internal/payments/00000000-0000-0000-0000-000000000001/execute"

    def post(address):
        return client.post(
            url,
            {"execution_id": "x"},
            content_type="application/json",
            HTTP_X_INTERNAL_AUTH="guess",
            REMOTE_ADDR=address,
        )

    assert [post("192.0.2.1").status_code for _ in range(2)] == [404, 404]
    assert throttled(post("192.0.2.1")) == 60
    assert post("192.0.2.2").status_code == 404
