"""A WSGI application that does nothing: ``bench/api_latency.py --bare`` serves it
with the shipped gunicorn settings, so the web CPU per request it reports is
gunicorn's own (HTTP parsing, the thread pool, the access log, sockets) under
the same load, without Django — what no change to the application can remove.

It answers the load's two requests as the service would, in shape only: a
``POST`` gets 201 with a ``payment_id`` (the load generator reads it back for
its status reads), anything else 200.
"""

import json

CREATED = json.dumps({"payment_id": "00000000-0000-0000-0000-000000000001"}).encode()
OK = b'{"status": "PENDING"}'


def application(environ, start_response):
    if environ["REQUEST_METHOD"] == "POST":
        environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        status, body = "201 Created", CREATED
    else:
        status, body = "200 OK", OK
    start_response(
        status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    )
    return [body]
