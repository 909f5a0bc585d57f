"""The web tier as deployed: gunicorn (gunicorn.conf.py) with several worker processes,
the shared Redis throttle cache, and the bounded PostgreSQL connection pool."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from collections import Counter

import pytest
from django.core.cache import cache
from django.db import connection

from payments.models import Payment
from tests.processes import Gunicorn, free_port, wait_until

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


class TcpProxy:
    """Forwards a local port to PostgreSQL. ``close()`` refuses new connections and cuts
    the open ones, as a database that went away does; ``open()`` brings it back."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = free_port()
        self.listener: socket.socket | None = None
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()

    def open(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.listener.settimeout(0.1)
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while listener.fileno() != -1:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            client.settimeout(None)
            upstream.settimeout(None)
            with self.lock:
                self.sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        with self.lock:
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self.sockets.clear()


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
