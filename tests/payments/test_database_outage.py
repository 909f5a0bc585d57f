"""A database that is unavailable answers 503 + Retry-After on every path, never a 500.

The outage is real: the process's connection is closed and pointed at a local
port nobody listens on, so every query fails the way a stopped or refusing
PostgreSQL makes it fail (psycopg OperationalError, wrapped by Django).
"""

import socket

import pytest
from django.db import connection
from django.test import RequestFactory

from payments.api.errors import json_500
from payments.models import IdempotencyKey, Payment

pytestmark = pytest.mark.django_db(transaction=True)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Outage:
    def __init__(self):
        self.port = connection.settings_dict["PORT"]
        self.host = connection.settings_dict["HOST"]

    def start(self):
        connection.close()
        connection.settings_dict["HOST"] = "127.0.0.1"
        connection.settings_dict["PORT"] = closed_port()

    def end(self):
        connection.close()
        connection.settings_dict["HOST"] = self.host
        connection.settings_dict["PORT"] = self.port


@pytest.fixture
def outage():
    outage = Outage()
    yield outage
    outage.end()


def unavailable(response, retry_after):
    assert response.status_code == 503, response.content
    assert response["Retry-After"] == str(retry_after)


def test_api_answers_503_service_unavailable_in_the_error_shape(alice, outage, settings):
    settings.SERVICE_UNAVAILABLE_RETRY_AFTER = 3
    outage.start()
    for response in (
        alice.api.get("/api/v1/accounts"),
        alice.schedule(),
        alice.api.get("/api/v1/payments/00000000-0000-0000-0000-000000000000"),
    ):
        unavailable(response, 3)
        assert response.json() == {
            "error": {
                "code": "service_unavailable",
                "message": "The service is temporarily unavailable; retry after the given delay.",
                "details": {"retry_after_seconds": 3},
            }
        }


def test_other_paths_answer_a_plain_503(client, alice, outage, settings):
    client.force_login(alice.user)  # a session row to load on the next request
    outage.start()
    admin = client.get("/admin/payments/payment/")
    unavailable(admin, settings.SERVICE_UNAVAILABLE_RETRY_AFTER)
    assert admin["Content-Type"].startswith("text/plain")
    assert client.get("/healthz").status_code == 200  # the process itself is alive
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"]["database"] == "error: OperationalError"
    assert ready.json()["checks"]["broker"] == "ok"


def test_an_outage_outside_any_view_is_a_503_too(outage, settings):
    """Django's 500 handler (errors raised in middleware, e.g. saving the session)."""
    outage.start()
    for path, content_type in (("/api/v1/accounts", "application/json"), ("/admin/", "text/")):
        request = RequestFactory().get(path)
        try:
            connection.ensure_connection()
        except Exception:
            response = json_500(request)  # as Django calls it: while the error is handled
        else:
            pytest.fail("the database answered")
        unavailable(response, settings.SERVICE_UNAVAILABLE_RETRY_AFTER)
        assert response["Content-Type"].startswith(content_type)
    request = RequestFactory().get("/api/v1/accounts")
    try:
        raise RuntimeError("a bug")
    except RuntimeError:
        assert json_500(request).status_code == 500


def test_an_idempotent_request_that_met_the_outage_succeeds_when_retried(alice, outage):
    key = {"Idempotency-Key": "during-outage"}
    outage.start()
    unavailable(alice.schedule(headers=key), 2)
    outage.end()
    assert IdempotencyKey.objects.count() == 0  # nothing was claimed
    retried = alice.schedule(headers=key)
    assert retried.status_code == 201, retried.content
    replay = alice.schedule(headers=key)
    assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"
    assert Payment.objects.count() == 1
