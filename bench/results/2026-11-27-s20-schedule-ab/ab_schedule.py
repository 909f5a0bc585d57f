"""Interleaved in-process A/B of the schedule request: old (ORM saves + queryset read) vs new."""
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
http = api_cost.WsgiClient(f"Bearer {info['token']}")
body = json.dumps({"from_account_id": src, "to_account_id": dst, "amount": 1, "delay_seconds": 3600}).encode()

from django.db.models.expressions import RawSQL
from payments import transitions
from payments.services import payments as svc
from payments.clock import db_now
from ledger.services import BATCH_ACCOUNT_FIELDS, read_accounts
from ledger.models import Account
from django.db import connection

new_schedule, new_read = transitions.schedule, svc._read_with_clock

def old_schedule(batch, *, actor, actor_user=None, event_data=None, **fields):
    payment = transitions.new_payment(batch, **fields)
    batch.flush()
    payment.save(force_insert=True)
    transitions.event(payment, "scheduled", actor=actor, actor_user=actor_user, **(event_data or {})).save()
    return payment

def old_read(account_ids):
    rows = list(Account.objects.filter(pk__in=set(account_ids)).only(*BATCH_ACCOUNT_FIELDS)
                .annotate(db_clock=RawSQL("clock_timestamp()", ())).order_by("pk"))
    return (rows[0].db_clock if rows else db_now()), {a.pk: a for a in rows}

arms = {
    "old": (old_schedule, old_read),
    "saves": (new_schedule, old_read),
    "read": (old_schedule, new_read),
    "both": (new_schedule, new_read),
}
names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(arms)
n = int(sys.argv[2]) if len(sys.argv) > 2 else 600
cpu = {k: 0.0 for k in names}
for k in names:  # warm-up
    transitions.schedule, svc._read_with_clock = arms[k]
    for _ in range(20):
        assert http.request("POST", "/api/v1/payments/schedule", body).status_code == 201
for i in range(n):
    for k in names:
        transitions.schedule, svc._read_with_clock = arms[k]
        t = time.process_time()
        r = http.request("POST", "/api/v1/payments/schedule", body)
        cpu[k] += time.process_time() - t
        assert r.status_code == 201, r.content
for k in names:
    print(f"{k}: {cpu[k]*1000/n:.3f} ms CPU per schedule (n={n}, interleaved)")
