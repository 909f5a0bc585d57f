"""Interleaved in-process A/B of the web's middleware: django-prometheus's two vs HttpMetricsMiddleware.

Both arms are WSGI handlers in one process (one built under override_settings
with the old MIDDLEWARE list), called request by request in turn, so host
speed drifts hit both alike. Usage: ab_metrics.py [n]
"""
import json, sys, time, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.scenarios import api_cost
from bench.harness.db import prepare
from bench.harness.api_load import create_client

served = {"DB_POOL": "true", "PROMETHEUS_MULTIPROC_DIR": tempfile.mkdtemp()}
prepare(api_cost.DATABASE, api_cost.REDIS_DB, API_THROTTLE_RATE="1000000/s", **served)
info = create_client("abclient", accounts=2, balance=10**12)
src, dst = info["account_ids"]
body = json.dumps({"from_account_id": src, "to_account_id": dst, "amount": 1, "delay_seconds": 3600}).encode()

from django.conf import settings
from django.test import override_settings

new_list = list(settings.MIDDLEWARE)
assert new_list[0] == "payments.middleware.HttpMetricsMiddleware"
old_list = ["django_prometheus.middleware.PrometheusBeforeMiddleware"] + new_list[1:]
old_list.insert(old_list.index("axes.middleware.AxesMiddleware"), "django_prometheus.middleware.PrometheusAfterMiddleware")
clients = {"new": api_cost.WsgiClient(f"Bearer {info['token']}")}
# django-prometheus registers the same names: take ours off the registry (their
# children still write their values) so its middleware can be built as well.
from prometheus_client import REGISTRY
from payments import metrics
for m in (metrics.http_requests, metrics.http_responses, metrics.http_latency, metrics.http_exceptions):
    REGISTRY.unregister(m)
with override_settings(MIDDLEWARE=old_list):
    clients["old"] = api_cost.WsgiClient(f"Bearer {info['token']}")

pid = json.loads(clients["new"].request("POST", "/api/v1/payments/schedule", body).content)["payment_id"]
kinds = {
    "schedule": ("POST", "/api/v1/payments/schedule", body, 201),
    "status": ("GET", f"/api/v1/payments/{pid}", b"", 200),
}
n = int(sys.argv[1]) if len(sys.argv) > 1 else 600
cpu = {(a, k): 0.0 for a in clients for k in kinds}
for a, c in clients.items():  # warm-up
    for k, (m, p, b, want) in kinds.items():
        for _ in range(20):
            assert c.request(m, p, b).status_code == want
for i in range(n):
    for k, (m, p, b, want) in kinds.items():
        for a, c in (clients.items() if i % 2 else reversed(clients.items())):
            t = time.process_time()
            r = c.request(m, p, b)
            cpu[(a, k)] += time.process_time() - t
            assert r.status_code == want, r.content
for k in kinds:
    for a in clients:
        print(f"{k} {a}: {cpu[(a, k)]*1000/n:.3f} ms CPU per request (n={n}, interleaved)")
