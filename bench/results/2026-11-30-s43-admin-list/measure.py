"""Time the admin's payments list on a table of N payments (session 43, one-off).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/scheduler_admin_m DEBUG=true \
    SECRET_KEY=x ROOT=<checkout> .venv/bin/python measure.py 1000000

Fills the (migrated) database with N CANCELLED payments the first time, then
times each URL five times through Django's test client as a superuser and
prints the median and the slowest statements of the last view. ROOT is the
checkout whose code is measured (sys.path first)."""
import os, sys, time
sys.path.insert(0, os.environ.get("ROOT", "/work/main"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings.base")
import django
django.setup()
from django.conf import settings
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.contrib.auth import get_user_model

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
settings.ALLOWED_HOSTS = ["*"]
User = get_user_model()
root, _ = User.objects.get_or_create(username="measure-root", defaults={"is_staff": True, "is_superuser": True})
from payments.models import Payment
if Payment.objects.count() < N:
    from ledger.models import Account
    from ledger import services as ledger
    owner, _ = User.objects.get_or_create(username="measure-client")
    a = Account.objects.create(name="a", owner=owner); b = Account.objects.create(name="b", owner=owner)
    cols = [f.column for f in Payment._meta.concrete_fields]
    exprs = {"id": "gen_random_uuid()", "from_account_id": str(a.pk), "to_account_id": str(b.pk),
             "owner_id": str(owner.pk), "amount": "1", "description": "''", "metadata": "'{}'::jsonb",
             "status": "'CANCELLED'", "due_at": "now() - g * interval '1 second'", "run_at": "now() - g * interval '1 second'",
             "partition": "mod(g, 16)", "fence": "1", "lease_expires_at": "NULL", "attempts": "0", "hold_id": "NULL",
             "journal_entry_id": "NULL", "error_code": "''", "error_message": "''", "recurring_id": "NULL",
             "created_at": "now() - g * interval '1 second'", "updated_at": "now()", "executed_at": "NULL",
             "cancelled_at": "now()"}
    missing = [c for c in cols if c not in exprs]
    assert not missing, missing
    with connection.cursor() as c:
        c.execute(f"INSERT INTO payments_payment ({', '.join(cols)}) SELECT {', '.join(exprs[c] for c in cols)} FROM generate_series(1, %s) g", [N])
        c.execute("VACUUM ANALYZE payments_payment")
print("payments:", Payment.objects.count())
client = Client()
client.force_login(root)
times = {}
def timed(execute, sql, params, many, context):
    t = time.perf_counter()
    try:
        return execute(sql, params, many, context)
    finally:
        times.setdefault("q", []).append((time.perf_counter() - t, sql[:110]))
import statistics
client.get("/admin/payments/payment/")  # warm-up
for url in ["/admin/payments/payment/", "/admin/payments/payment/?status__exact=CANCELLED", "/admin/payments/payment/?p=5", "/admin/ledger/journalentry/"]:
    walls = []
    for _ in range(5):
        times.clear()
        t = time.perf_counter()
        with connection.execute_wrapper(timed):
            r = client.get(url)
        walls.append(time.perf_counter() - t)
    print(f"{url}: {r.status_code} median {statistics.median(walls)*1000:.0f} ms (min {min(walls)*1000:.0f}, max {max(walls)*1000:.0f}), {len(times.get('q', []))} statements")
    for d, sql in sorted(times.get("q", []), reverse=True)[:4]:
        print(f"   {d*1000:8.1f} ms  {sql}")
