"""Support admin, operations page, health and metrics."""

import re
import uuid
from datetime import timedelta

import pytest
import yaml
from django.urls import reverse
from django.utils import timezone

from ledger.models import Account, JournalEntry, ReconciliationRun
from payments.engine import executor, reaper
from payments.models import Payment
from tests.factories import UserFactory
from tests.payments.helpers import make_due, sweep

pytestmark = pytest.mark.django_db


def changelist_action(client, model, action, ids):
    return client.post(
        reverse(f"admin:payments_{model}_changelist"),
        {"action": action, "_selected_action": [str(i) for i in ids]},
        follow=True,
    )


def test_support_finds_payment_by_id_account_and_owner(support, alice):
    pid = alice.schedule().json()["payment_id"]
    url = reverse("admin:payments_payment_changelist")
    for term in (pid, str(alice.account.pk), "alice"):
        page = support.get(url, {"q": term})
        assert page.status_code == 200 and pid in page.content.decode(), term
    assert pid not in support.get(url, {"q": "nobody"}).content.decode()
    page = support.get(
        url,
        {
            "status__exact": "PENDING",
            "due": "hour",
            "partition": Payment.objects.get(pk=pid).partition,
        },
    )
    assert pid in page.content.decode()


def result_rows(html: str) -> list[dict[str, str]]:
    """The changelist's rows as {column class: cell text}."""
    table = re.search(r'<table id="result_list">.*?</table>', html, re.S).group(0)
    rows = []
    for row in re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>", 1)[1], re.S):
        cells = re.findall(r'<t[dh] class="field-(\w+)[^"]*">(.*?)</t[dh]>', row, re.S)
        rows.append({name: re.sub(r"<[^>]+>", "", text).strip() for name, text in cells})
    return rows


TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


def test_payment_list_newest_due_first_with_short_ids_times_and_lateness(
    support, alice, monkeypatch
):
    early, late, later = (
        alice.schedule(amount=10, delay_seconds=s).json()["payment_id"] for s in (60, 600, 7200)
    )
    make_due(early, seconds_ago=2)
    _, published = sweep(monkeypatch)
    executor.execute_chunk(published.items())
    executed = Payment.objects.get(pk=early)
    assert executed.status == "COMPLETED"

    page = support.get(reverse("admin:payments_payment_changelist"))
    rows = result_rows(page.content.decode())
    assert [row["short_id"] for row in rows] == [pid[:8] for pid in (later, late, early)]
    assert f'title="{later}"' in page.content.decode()  # the whole id on hover
    assert rows[0]["from_link"] == f"#{alice.account.pk}"
    for row in rows:
        assert re.fullmatch(TIME, row["due_at"]), row
    assert re.fullmatch(TIME, rows[2]["executed_at"])
    expected = (executed.executed_at - executed.due_at).total_seconds() * 1000
    assert rows[2]["late_by"] == f"{expected:,.1f} ms"
    assert rows[0]["late_by"] == rows[0]["executed_at"] == "-"

    # The short id the list shows finds its payment; an account id still finds its payments.
    url = reverse("admin:payments_payment_changelist")
    found = result_rows(support.get(url, {"q": late[:8]}).content.decode())
    assert [row["short_id"] for row in found] == [late[:8]]
    found = result_rows(support.get(url, {"q": str(alice.account.pk)}).content.decode())
    assert len(found) == 3


def test_payment_page_and_statement_show_times_to_the_second_and_link_the_payment(
    support, alice, monkeypatch
):
    pid = alice.schedule(amount=70, description="rent").json()["payment_id"]
    make_due(pid)
    _, published = sweep(monkeypatch)
    executor.execute_chunk(published.items())

    page = support.get(reverse("admin:payments_payment_change", args=[pid])).content.decode()
    due = re.search(r'field-due_at.*?<div class="readonly">(.*?)</div>', page, re.S).group(1)
    assert re.fullmatch(TIME, due)
    events = re.search(r'id="events-group".*', page, re.S).group(0)
    assert re.search(TIME, events)

    html = support.get(
        reverse("admin:ledger_account_change", args=[alice.other_account.pk])
    ).content.decode()
    table = re.search(r'<table class="statement".*?</table>', html, re.S).group(0)
    headers = re.findall(r"<th[^>]*>(.*?)</th>", table)
    assert headers == ["Time", "Amount", "Balance after", "Description", "Payment"]
    (row,) = re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>", 1)[1], re.S)
    cells = [c.strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
    assert re.fullmatch(TIME, cells[0]) and cells[1:4] == ["+70", "70", "rent"]
    assert f'href="/admin/payments/payment/{pid}/change/"' in cells[4]
    assert f"payment {pid[:8]}" in cells[4]


def test_support_cancels_through_the_service_and_is_named_in_the_audit(support, alice):
    pid = alice.schedule(amount=300).json()["payment_id"]
    page = changelist_action(support, "payment", "cancel_payments", [pid])
    assert "1 payment(s) cancelled" in page.content.decode()
    payment = Payment.objects.get(pk=pid)
    assert payment.status == "CANCELLED" and payment.hold.status == "released"
    event = payment.events.get(type="cancelled")
    assert (event.actor, event.actor_user) == ("staff", support.user)
    assert Account.objects.get(pk=alice.account.pk).held == 0
    detail = support.get(reverse("admin:payments_payment_change", args=[pid])).content.decode()
    assert "CANCELLED" in detail and "sam" in detail


def test_support_cannot_edit_payments_or_balances(support, alice):
    pid = alice.schedule(amount=300).json()["payment_id"]
    page = support.get(reverse("admin:payments_payment_change", args=[pid]))
    assert page.status_code == 200 and not page.context["has_change_permission"]
    response = support.post(
        reverse("admin:payments_payment_change", args=[pid]), {"amount": 1, "status": "COMPLETED"}
    )
    assert response.status_code == 403
    assert Payment.objects.get(pk=pid).amount == 300
    account_url = reverse("admin:ledger_account_change", args=[alice.account.pk])
    response = support.post(account_url, {"name": "x", "max_payment_amount": 5, "balance": 10**9})
    assert response.status_code == 403
    adjust = reverse("admin:ledger_account_adjust", args=[alice.account.pk])
    assert support.get(adjust).status_code == 403
    assert support.post(adjust, {"amount": 10**6, "reason": "free money"}).status_code == 403
    for name in ("payments.change_payment", "ledger.change_account", "ledger.post_adjustment"):
        assert not support.user.has_perm(name)
    assert Account.objects.get(pk=alice.account.pk).balance == 10_000
    assert not JournalEntry.objects.filter(kind="adjustment").exists()


def test_support_freezes_accounts(support, alice):
    support.post(
        reverse("admin:ledger_account_changelist"),
        {"action": "freeze", "_selected_action": [alice.account.pk]},
    )
    assert Account.objects.get(pk=alice.account.pk).status == "frozen"


def test_privileged_staff_posts_balanced_adjustments(client, alice):
    from django.contrib.auth.models import Permission

    boss = UserFactory(username="boss", is_staff=True)
    boss.user_permissions.add(
        Permission.objects.get(codename="post_adjustment"),
        Permission.objects.get(codename="view_account"),
    )
    client.force_login(boss)
    adjust = reverse("admin:ledger_account_adjust", args=[alice.account.pk])
    assert client.post(adjust, {"amount": 0, "reason": "x"}).status_code == 200  # form error
    response = client.post(adjust, {"amount": 250, "reason": "goodwill"})
    assert response.status_code == 302
    entry = JournalEntry.objects.get(kind="adjustment")
    assert entry.created_by == boss and sorted(entry.postings.values_list("amount", flat=True)) == [
        -250,
        250,
    ]
    assert Account.objects.get(pk=alice.account.pk).balance == 10_250


def test_dead_letter_list_and_retry(support, alice, settings, monkeypatch):

    settings.PAYMENT_MAX_ATTEMPTS = 1
    pid = alice.schedule(amount=50).json()["payment_id"]
    make_due(pid)
    sweep(monkeypatch)
    Payment.objects.filter(pk=pid).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    reaper.reap_leases()
    assert Payment.objects.get(pk=pid).error_code == "max_attempts_exceeded"
    page = support.get(reverse("admin:payments_deadletter_changelist"))
    assert pid in page.content.decode()
    changelist_action(support, "deadletter", "retry_dead_letters", [pid])
    payment = Payment.objects.get(pk=pid)
    assert (payment.status, payment.attempts, payment.hold.status) == ("PENDING", 0, "active")
    assert payment.events.get(type="retried").actor_user == support.user
    assert Account.objects.get(pk=alice.account.pk).held == 50


def test_operations_page_renders_figures_and_charts(support, alice, monkeypatch):
    ids = [alice.schedule(amount=10, delay_seconds=600).json()["payment_id"] for _ in range(3)]
    make_due(*ids[:2])
    _, published = sweep(monkeypatch)
    executor.execute_chunk(published.items())
    ReconciliationRun.objects.create(
        started_at=timezone.now(), duration_seconds=0.1, ok=True, mismatch_count=0, report={}
    )
    page = support.get("/admin/operations/")
    assert page.status_code == 200
    html = page.content.decode()
    for element in (
        'id="backlog-chart"',
        'id="executed-chart"',
        'id="failed-chart"',
        "Dead letters",
    ):
        assert element in html
    assert page.context["backlog"]["< 1 h"] == 1
    assert page.context["total_executed"] == 2
    assert page.context["lateness"]["count"] == 2
    assert "clean" in html
    assert len(re.findall(r'<rect class="bar"', html)) >= 60
    charts = {chart["id"]: chart for chart in page.context["charts"]}
    for chart in charts.values():
        assert chart["title"] and chart["x_label"] and chart["y_label"], chart
        assert f">{chart['title']}</figcaption>" in html
    executed = charts["executed-chart"]
    assert executed["y_label"] == "payments per minute" and executed["total"] == 2
    assert [t["label"] for t in executed["y_ticks"]] == ["0", "1", "2"]
    assert [t["label"] for t in executed["x_ticks"]] == ["50", "40", "30", "20", "10", "0"]
    assert [t["label"] for t in charts["backlog-chart"]["x_ticks"]] == list(page.context["backlog"])
    # One number format: milliseconds with one decimal.
    for quantile, text in page.context["lateness_ms"].items():
        assert re.fullmatch(r"[\d,]+\.\d ms", text), (quantile, text)
    assert re.fullmatch(r"[\d,]+\.\d ms", page.context["reconciliation_duration"])
    assert page.context["reconciliation_duration"] == "100.0 ms"
    assert support.get("/admin/").content.decode().count("/admin/operations/") == 1


def test_operations_page_needs_staff(client, alice):
    assert client.get("/admin/operations/").status_code == 302  # to login
    client.force_login(alice.user)
    assert client.get("/admin/operations/").status_code == 302


def test_health_endpoints(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"database": "ok", "broker": "ok"}


def test_readyz_reports_a_dead_broker(client, settings):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"]["broker"].startswith("error")


# --- /metrics: who may scrape, and what a scrape costs the database -----------


def test_metrics_answers_loopback_and_allowed_networks_only(client, settings):
    assert client.get("/metrics").status_code == 200  # the test client is 127.0.0.1
    assert client.get("/metrics", REMOTE_ADDR="::1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="::ffff:127.0.0.1").status_code == 200
    outside = client.get("/metrics", REMOTE_ADDR="203.0.113.9")
    assert outside.status_code == 403
    assert "payments_" not in outside.content.decode()
    # X-Forwarded-For is written by the client: it never makes a caller local.
    spoofed = client.get("/metrics", REMOTE_ADDR="203.0.113.9", HTTP_X_FORWARDED_FOR="127.0.0.1")
    assert spoofed.status_code == 403
    settings.METRICS_ALLOWED_NETWORKS = ["10.0.0.0/8", "203.0.113.0/24"]
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.9").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 403
    settings.METRICS_ALLOWED_NETWORKS = []
    assert client.get("/metrics").status_code == 403


def test_metrics_answers_the_bearer_token(client, settings):
    settings.METRICS_ALLOWED_NETWORKS = []
    outside = {"REMOTE_ADDR": "203.0.113.9"}
    # No token configured: no token opens it, not even an empty one.
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ", **outside).status_code == 403
    settings.METRICS_TOKEN = "scrape-secret"
    assert client.get("/metrics", **outside).status_code == 403
    wrong = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secreT", **outside)
    assert wrong.status_code == 403
    basic = client.get("/metrics", HTTP_AUTHORIZATION="Basic scrape-secret", **outside)
    assert basic.status_code == 403
    ok = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret", **outside)
    assert ok.status_code == 200
    assert "payments_pending" in ok.content.decode()


class FakeClock:
    """Stands in for time.monotonic; far from any real reading, so the shared
    collector's cache (computed under another clock) counts as stale."""

    def __init__(self):
        self.now = 1e9

    def __call__(self):
        return self.now


def payment_queries(captured) -> int:
    return sum("payments_payment" in q["sql"] for q in captured.captured_queries)


def test_metrics_database_gauges_are_computed_once_per_window(client, alice, settings, monkeypatch):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from payments import views_ops

    settings.METRICS_DB_CACHE_SECONDS = 15
    clock = FakeClock()
    monkeypatch.setattr(views_ops._database_collector, "clock", clock)
    alice.schedule()

    with CaptureQueriesContext(connection) as first:
        assert metric(client.get("/metrics").content.decode(), "payments_pending") == 1
    assert payment_queries(first) >= 4  # backlog, dead letters, pending, queued

    alice.schedule()
    clock.now += 14
    with CaptureQueriesContext(connection) as scrapes:
        for _ in range(20):
            text = client.get("/metrics").content.decode()
            assert metric(text, "payments_pending") == 1  # the cached figure
    assert payment_queries(scrapes) == 0

    clock.now += 1  # the window is over: the next scrape asks the database again
    with CaptureQueriesContext(connection) as stale:
        assert metric(client.get("/metrics").content.decode(), "payments_pending") == 2
    assert payment_queries(stale) == payment_queries(first)


def test_concurrent_scrapes_wait_for_the_one_computation(db, settings, monkeypatch):
    """Threads scraping at once (gunicorn threads) run the aggregate queries once."""
    import time

    from django.test import Client

    from payments import ops, views_ops
    from tests.concurrency import run_in_threads

    settings.METRICS_DB_CACHE_SECONDS = 15
    monkeypatch.setattr(views_ops._database_collector, "clock", FakeClock())
    computations = []
    real_backlog = ops.backlog_by_bucket

    def slow_backlog():
        computations.append(1)
        time.sleep(0.3)  # every other scrape arrives while this one is computing
        return real_backlog()

    monkeypatch.setattr(ops, "backlog_by_bucket", slow_backlog)
    answers = []

    def scrape(_):
        response = Client().get("/metrics")
        answers.append((response.status_code, "payments_pending" in response.content.decode()))

    assert run_in_threads(scrape, 8) == []
    assert answers == [(200, True)] * 8
    assert len(computations) == 1


# --- admin login lockout ---------------------------------------------------------


def admin_login(client, username, password, ip="198.51.100.7"):
    return client.post(
        "/admin/login/?next=/admin/",
        {"username": username, "password": password},
        REMOTE_ADDR=ip,
    )


def test_admin_login_locks_out_an_address_and_username_after_failures(client, settings):
    import time_machine
    from django.utils import timezone

    settings.AXES_FAILURE_LIMIT = 3
    staff = UserFactory(username="ops", is_staff=True, is_superuser=True)
    staff.set_password("correct horse battery")
    staff.save()
    for _ in range(2):
        response = admin_login(client, "ops", "guess")
        assert response.status_code == 200  # the form again, with an error
    assert admin_login(client, "ops", "guess").status_code == 429  # the third locks
    locked = admin_login(client, "ops", "correct horse battery")
    assert locked.status_code == 429
    assert "_auth_user_id" not in client.session
    # Another address with the same username, or another username from the
    # same address, is not locked out.
    other = UserFactory(username="ops2", is_staff=True)
    other.set_password("another secret phrase")
    other.save()
    assert admin_login(client, "ops2", "another secret phrase").status_code == 302
    client.logout()
    assert admin_login(client, "ops", "correct horse battery", ip="192.0.2.1").status_code == 302
    client.logout()
    # After the cool-off the right password works again from the locked address.
    with time_machine.travel(timezone.now() + settings.AXES_COOLOFF_TIME + timedelta(seconds=1)):
        assert admin_login(client, "ops", "correct horse battery").status_code == 302


def metric(text, name, labels=""):
    pattern = rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+]+)$"
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_metrics_move_after_payments_execute(
    client, alice, monkeypatch, django_capture_on_commit_callbacks
):
    ids = [alice.schedule(amount=10).json()["payment_id"] for _ in range(4)]
    before = client.get("/metrics").content.decode()
    make_due(*ids)
    _, published = sweep(monkeypatch)
    with django_capture_on_commit_callbacks(execute=True):
        executor.execute_chunk(published.items())
    after = client.get("/metrics").content.decode()
    assert metric(after, "payments_executed_total") - metric(before, "payments_executed_total") == 4
    assert (
        metric(after, "payments_lateness_seconds_count")
        - metric(before, "payments_lateness_seconds_count")
        == 4
    )
    assert 'payments_lateness_seconds_bucket{le="0.25"}' in after
    assert metric(after, "payments_pending") == 0
    assert 'payments_backlog{bucket="overdue"}' in after


def sample(text, name, **labels):
    """The value of ``name``'s sample with exactly these labels (any order), else 0."""
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if head.partition("{")[0] == name:
            found = dict(re.findall(r'(\w+)="([^"]*)"', head.partition("{")[2]))
            if found == labels:
                return float(value)
    return 0.0


def test_http_metrics_count_and_time_each_request_by_view_method_and_status(client, alice):
    """payments.middleware.HttpMetricsMiddleware: django-prometheus's names and labels."""
    responses = "django_http_responses_total_by_status_view_method_total"
    latency = "django_http_requests_latency_seconds_by_view_method"
    schedule = {"view": "payment-schedule", "method": "POST"}
    detail = {"view": "payment-detail", "method": "GET"}
    series = {
        "created": (responses, {"status": "201", **schedule}),
        "read": (responses, {"status": "200", **detail}),
        "unknown": (responses, {"status": "404", **detail}),
        "no route": (responses, {"status": "404", "view": "<unnamed view>", "method": "GET"}),
        "invalid": (
            responses,
            {"status": "405", "view": "payment-detail", "method": "<invalid method>"},
        ),
        "posts": (
            "django_http_requests_total_by_view_transport_method_total",
            {"transport": "http", **schedule},
        ),
        "timed": (f"{latency}_count", schedule),
        "under 75 s": (f"{latency}_bucket", {"le": "75.0", **schedule}),
        "all": (f"{latency}_bucket", {"le": "+Inf", **schedule}),
        "fast": (f"{latency}_bucket", {"le": "0.01", **schedule}),
        "seconds": (f"{latency}_sum", schedule),
    }

    def read():
        text = client.get("/metrics").content.decode()
        return {key: sample(text, name, **labels) for key, (name, labels) in series.items()}

    before = read()
    pid = alice.schedule().json()["payment_id"]
    assert alice.schedule().status_code == 201
    assert alice.api.get(f"/api/v1/payments/{pid}").status_code == 200
    for _ in range(3):
        assert alice.api.get(f"/api/v1/payments/{uuid.uuid4()}").status_code == 404
    assert alice.api.get("/api/v1/no-such-path").status_code == 404
    assert alice.api.generic("BREW", f"/api/v1/payments/{pid}").status_code == 405
    after = read()
    moved = {key: after[key] - before[key] for key in series}
    fast, seconds = moved.pop("fast"), moved.pop("seconds")
    assert moved == {
        "created": 2,
        "read": 1,
        "unknown": 3,
        "no route": 1,
        "invalid": 1,
        "posts": 2,
        "timed": 2,
        "under 75 s": 2,
        "all": 2,
    }
    assert 0 <= fast <= 2  # however fast this machine is
    assert 0 < seconds < 75


def test_http_metrics_count_exceptions_by_type_and_https_by_transport(client, alice, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    pid = alice.schedule().json()["payment_id"]
    exceptions = "django_http_exceptions_total_by_type_total"
    https = (
        "django_http_requests_total_by_view_transport_method_total",
        {"view": "payment-detail", "transport": "https", "method": "GET"},
    )

    def read():
        text = client.get("/metrics").content.decode()
        return sample(text, exceptions, type="RuntimeError"), sample(text, https[0], **https[1])

    before = read()
    assert alice.api.get(f"/api/v1/payments/{pid}", secure=True).status_code == 200
    # A view outside DRF (DRF's own answer every exception: payments.api.errors)
    monkeypatch.setattr("payments.views_ops.JsonResponse", boom)
    client.raise_request_exception = False
    assert client.get("/healthz").status_code == 500
    after = read()
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)


def test_a_metric_that_cannot_be_written_leaves_the_response_as_it_was(alice, monkeypatch, caplog):
    """A schedule that committed is a 201 even when its request metrics fail."""

    def broken(**labels):
        raise OSError("metrics directory not writable")

    from payments import metrics

    monkeypatch.setattr(metrics.http_responses, "labels", broken)
    response = alice.schedule(description="unmetered")
    assert response.status_code == 201, response.content
    assert "HTTP metrics not recorded" in caplog.text


def test_alert_rules_parse_and_name_existing_metrics(client):
    from pathlib import Path

    rules = yaml.safe_load((Path(__file__).parents[2] / "ops/prometheus/alerts.yml").read_text())
    exposition = client.get("/metrics").content.decode()
    exported = set(re.findall(r"^# TYPE (\S+) (\w+)", exposition, re.MULTILINE))
    names = set()
    for name, kind in exported:
        names.add(name)
        if kind == "counter":
            names.add(f"{name}_total")
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    assert {a["alert"] for a in alerts} >= {
        "PaymentFailureRateHigh",
        "PaymentLatenessP95High",
        "PaymentBacklogOverdue",
        "LedgerReconciliationMismatch",
        "SweeperSilent",
    }
    promql_words = {
        "sum",
        "rate",
        "increase",
        "clamp_min",
        "histogram_quantile",
        "by",
        "le",
        "absent",
        "or",
        "time",
        "bucket",
    }
    for alert in alerts:
        assert alert["expr"] and alert["annotations"]["summary"]
        referenced = {
            w
            # label values ("gave_up") are not names: quoted strings left out
            for w in re.findall(r"\b([a-z_][a-z0-9_]*)\b", re.sub(r'"[^"]*"', "", alert["expr"]))
            if "_" in w and w not in promql_words
        }
        assert referenced, alert["alert"]
        assert referenced <= names, (alert["alert"], referenced - names)


def test_metrics_page_is_rendered_at_most_once_per_window(client, settings, monkeypatch):
    """However often /metrics is scraped, a process renders the exposition once per
    METRICS_RENDER_CACHE_SECONDS; concurrent scrapes share that render."""
    from payments import views_ops
    from tests.concurrency import run_in_threads

    settings.METRICS_RENDER_CACHE_SECONDS = 60
    renders = []
    real = views_ops.render_exposition

    def counting_render():
        renders.append(1)
        return real()

    monkeypatch.setattr(views_ops, "_exposition", views_ops.RenderedExposition(counting_render))
    bodies = []
    errors = run_in_threads(lambda i: bodies.append(client.get("/metrics").content), 8)
    assert errors == [] and len(bodies) == 8
    for _ in range(20):
        assert client.get("/metrics").status_code == 200
    assert len(renders) == 1 and len(set(bodies)) == 1
    settings.METRICS_RENDER_CACHE_SECONDS = 0  # a window of 0 renders every time
    client.get("/metrics")
    client.get("/metrics")
    assert len(renders) == 3
