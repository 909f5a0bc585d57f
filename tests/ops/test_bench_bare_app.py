"""``bench/api_latency.py --bare`` serves ``bench.harness.bare_wsgi`` under the
API load, to measure gunicorn's own CPU per request. The load generator reads
each schedule answer's ``payment_id`` back for its status reads and counts any
other status code as an error, so the app must answer in the service's shape."""

from __future__ import annotations

import io
import json

from bench.harness.bare_wsgi import application


def call(method: str, stream: io.BytesIO | None = None) -> tuple[str, dict, bytes]:
    stream = stream or io.BytesIO()
    seen = {}

    def start_response(status, headers):
        seen["status"], seen["headers"] = status, dict(headers)

    environ = {
        "REQUEST_METHOD": method,
        "CONTENT_LENGTH": str(len(stream.getvalue())),
        "wsgi.input": stream,
    }
    answer = b"".join(application(environ, start_response))
    return seen["status"], seen["headers"], answer


def test_a_schedule_gets_a_201_with_a_payment_id_and_its_body_is_read():
    body = json.dumps({"from_account_id": 1, "to_account_id": 2, "amount": 5}).encode()
    stream = io.BytesIO(body)
    status, headers, answer = call("POST", stream)
    assert status.startswith("201 ")
    assert json.loads(answer)["payment_id"]
    assert headers["Content-Length"] == str(len(answer))
    assert stream.tell() == len(body)  # read, as a keep-alive connection needs


def test_a_status_read_gets_a_200():
    status, headers, answer = call("GET")
    assert status.startswith("200 ")
    assert headers["Content-Length"] == str(len(answer))
    assert json.loads(answer)
