"""The web tier as deployed: gunicorn (gunicorn.conf.py) with several worker processes,
the shared Redis throttle cache, and the bounded PostgreSQL connection pool."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter

import pytest
from django.core.cache import cache
from django.db import connection

from payments.models import Payment
from tests.network import TcpProxy
from tests.processes import Gunicorn, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def shared_cache():
    cache.clear()  # this cache's keys only (scheduler_project.cache.RedisCache)
    yield
    cache.clear()


@pytest.mark.django_db
def test_gunicorn_workers_spend_one_shared_throttle_budget(tmp_path, shared_cache):
    """Two worker processes, one client address: one budget, not one per process."""
    rate = 5
    web = Gunicorn(tmp_path, workers=2, INTERNAL_API_THROTTLE_RATE=f"{rate}/hour")
    url = "/api/v1/internal/payments/00000000-0000-0000-0000-000000000001/execute"
    statuses: list[int] = []

    def send(count: int) -> Counter:
        for _ in range(count):
            status, _, _ = web.request(
                "POST", url, {"execution_id": "x"}, {"X-Internal-Auth": "guess"}
            )
            statuses.append(status)
        wait_until(
            lambda: sum(web.answered_by(url).values()) == len(statuses), 10, 0.05, "access log"
        )
        return web.answered_by(url)

    stopped: list[int] = []
    try:
        answered = send(2 * rate + 2)
        # Which worker accepts a connection is the kernel's choice, and one may
        # take them all: unless both have answered past the budget, pause the
        # one that has (SIGSTOP: it accepts nothing), so the other must answer.
        if not (len(answered) == 2 and min(answered.values()) > rate):
            stopped = [int(pid.strip("<>")) for pid, n in answered.items() if n > rate]
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
            answered = send(rate + 1)
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        web.stop()
    assert len(answered) == 2 and min(answered.values()) > rate, (answered, web.logs())
    # The budget's requests reach the token check (404: X-Internal-Auth wrong);
    # every other is throttled, whichever worker answered it.
    assert statuses.count(404) == rate, Counter(statuses)
    assert statuses.count(429) == len(statuses) - rate


@pytest.mark.django_db(transaction=True)
def test_gunicorn_answers_503_while_the_database_is_away_and_retries_succeed(tmp_path, alice):
    db = connection.settings_dict
    proxy = TcpProxy(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))
    proxy.open()
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    web = Gunicorn(
        tmp_path,
        workers=1,
        DATABASE_URL=f"postgres://{db['USER']}{password}@127.0.0.1:{proxy.port}/{db['NAME']}",
        DB_POOL_MAX_SIZE="2",
        DB_POOL_TIMEOUT="1",
        SERVICE_UNAVAILABLE_RETRY_AFTER="1",
    )
    auth = {"Authorization": f"Bearer {alice.token}"}
    body = {
        "from_account_id": alice.account.pk,
        "to_account_id": alice.other_account.pk,
        "amount": 100,
        "delay_seconds": 60,
    }
    try:
        assert web.request("GET", "/readyz")[0] == 200
        status, _, content = web.request("POST", "/api/v1/payments", body, auth)
        assert status == 201, content  # the pool holds a live connection now

        proxy.close()
        key = auth | {"Idempotency-Key": "outage-1"}
        status, headers, content = web.request("POST", "/api/v1/payments", body, key)
        assert status == 503, (content, web.logs())
        assert headers["Retry-After"] == "1"
        assert json.loads(content)["error"]["code"] == "service_unavailable"
        status, _, content = web.request("GET", "/readyz")
        assert status == 503 and json.loads(content)["checks"]["database"].startswith("error")
        session = {"Cookie": "sessionid=" + "a" * 32}  # a well-formed key: looked up
        status, headers, content = web.request("GET", "/admin/payments/payment/", headers=session)
        assert status == 503 and headers["Retry-After"] == "1", content
        assert headers["Content-Type"].startswith("text/plain")
        assert web.request("GET", "/healthz")[0] == 200

        proxy.open()
        # A client that honours Retry-After gets through once the database is back.
        deadline = time.monotonic() + 90
        while True:
            status, headers, content = web.request("POST", "/api/v1/payments", body, key)
            if status != 503 or time.monotonic() > deadline:
                break
            time.sleep(int(headers["Retry-After"]))
        assert status == 201, (content, web.logs())
        status, headers, _ = web.request("POST", "/api/v1/payments", body, key)
        assert status == 201 and headers["Idempotent-Replayed"] == "true"
        assert all(status < 500 or status == 503 for _, status, _ in web.access())
    finally:
        web.stop()
        proxy.close()
    assert Payment.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_gunicorn_refuses_a_chunked_body_with_411_and_takes_it_with_its_length(tmp_path, alice):
    """What the middleware's 411 relies on, as served: gunicorn decodes a chunked
    body but passes no CONTENT_LENGTH, and Django then reads none of it."""
    import http.client

    body = json.dumps(
        {
            "from_account_id": alice.account.pk,
            "to_account_id": alice.other_account.pk,
            "amount": 100,
            "delay_seconds": 60,
        }
    ).encode()
    headers = {"Authorization": f"Bearer {alice.token}", "Content-Type": "application/json"}
    web = Gunicorn(tmp_path, workers=1)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=30)
        conn.request(
            "POST", "/api/v1/payments", body=iter([body]), headers=headers, encode_chunked=True
        )
        response = conn.getresponse()
        answer = json.loads(response.read())
        assert response.status == 411, answer
        assert answer["error"]["code"] == "length_required"
        conn.close()
        status, _, content = web.request("POST", "/api/v1/payments", json.loads(body), headers)
        assert status == 201, content
    finally:
        web.stop()
    assert Payment.objects.count() == 1
