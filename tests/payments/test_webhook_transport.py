"""Webhook SSRF rules: at registration (POST and PATCH) and again at connect time.

Nothing here connects anywhere but 127.0.0.1: refused addresses are refused
before a socket exists (``_webhooks_stay_on_this_machine`` in conftest makes
any other connect fail the test), DNS answers come from ``fake_dns``.
"""

import json
import ssl
import threading

import pytest

from payments import webhook_transport, webhooks
from payments.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from tests.payments.conftest import dispatched
from tests.payments.test_api import error
from tests.payments.test_webhooks import PUBLIC_IP, register
from tests.payments.webhook_receivers import DripServer, Receiver, self_signed

pytestmark = pytest.mark.django_db

EVENTS = ["payment.cancelled"]

# Every address of the issue, plus the other ranges the rules name.
REFUSED_URLS = [
    "http://10.0.0.1/",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fd00::1]/",
    "http://metadata.google.internal/",
    "http://0.0.0.0:8777/",
    "ftp://files.example.com/hooks",
    "http://user:pass@hooks.example.com/",
    "https://user@hooks.example.com/",
    "https://10.0.0.1/",
    "https://172.16.5.4/",
    "https://192.168.1.1/",
    "https://127.0.0.2/",
    "https://[::1]/",
    "https://localhost/",
    "https://metadata.google.internal./computeMetadata/v1/",
    "https://instance-data/latest/",
    "https://printer.local/",
    "https://169.254.0.1/",
    "https://[fe80::1]/",
    "https://224.0.0.1/",
    "https://[ff02::1]/",
    "https://240.0.0.1/",
    "https://255.255.255.255/",
    "https://100.64.0.1/",
    "https://100.100.100.200/",
    "https://168.63.129.16/machine?comp=goalstate",  # Azure WireServer
    "https://[::]/",
    "https://[::ffff:10.0.0.1]/",
    "https://[::ffff:169.254.169.254]/",
    "https://[::ffff:127.0.0.1]/",
    "https://[2002:a00:1::1]/",
    "https://[64:ff9b::a9fe:a9fe]/",
    "https://[fd00:ec2::254]/",
    "https://does-not-exist.invalid/hooks",  # does not resolve
    "https://internal.example.com/hooks",  # resolves to a private address (fake_dns)
    "https://mixed.example.com/hooks",  # one public and one private address (fake_dns)
    "https://rebind-target.example.com/hooks",  # resolves to loopback (fake_dns)
]


@pytest.fixture
def dns(fake_dns):
    fake_dns["hooks.example.com"] = [PUBLIC_IP]
    fake_dns["files.example.com"] = [PUBLIC_IP]
    fake_dns["internal.example.com"] = ["10.1.2.3"]
    fake_dns["mixed.example.com"] = [PUBLIC_IP, "192.168.7.7"]
    fake_dns["rebind-target.example.com"] = ["127.0.0.1"]
    return fake_dns


def assert_url_refused(response):
    body = error(response, 400, "validation_error")
    assert list(body["details"]["fields"]) == ["url"]
    text = json.dumps(body)
    for address in ("10.1.2.3", "192.168.7.7", "127.0.0.1", PUBLIC_IP):
        assert address not in text  # resolved addresses are never echoed
    return body


@pytest.mark.parametrize("url", REFUSED_URLS)
def test_registration_refuses_internal_addresses(alice, dns, url, settings):
    settings.WEBHOOK_ALLOW_HTTP = True  # so the http URLs are refused for their address
    assert_url_refused(
        alice.api.post(
            "/api/v1/webhook-endpoints", {"url": url, "event_types": EVENTS}, format="json"
        )
    )
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.parametrize("url", REFUSED_URLS)
def test_patch_refuses_internal_addresses(alice, dns, url, settings):
    settings.WEBHOOK_ALLOW_HTTP = True
    eid = register(alice, "https://hooks.example.com/hooks", EVENTS)["webhook_endpoint_id"]
    assert_url_refused(
        alice.api.patch(f"/api/v1/webhook-endpoints/{eid}", {"url": url}, format="json")
    )
    assert WebhookEndpoint.objects.get().url == "https://hooks.example.com/hooks"


def test_public_https_urls_are_accepted(alice, dns):
    dns["v6.example.com"] = ["2606:4700:4700::1111"]
    for url in (
        "https://hooks.example.com/x?y=1",
        "https://v6.example.com:8443/",
        f"https://{PUBLIC_IP}/",
    ):
        assert register(alice, url, EVENTS)["url"] == url


def test_http_only_with_the_setting(alice, dns, settings):
    settings.WEBHOOK_ALLOW_HTTP = False
    body = assert_url_refused(
        alice.api.post(
            "/api/v1/webhook-endpoints",
            {"url": "http://hooks.example.com/", "event_types": EVENTS},
            format="json",
        )
    )
    assert "https" in body["message"]
    settings.WEBHOOK_ALLOW_HTTP = True
    assert register(alice, "http://hooks.example.com/", EVENTS)


def test_allowed_hosts_exempt_a_host_from_the_address_rules(alice, dns, settings):
    settings.WEBHOOK_ALLOWED_HOSTS = []
    url = "http://127.0.0.1:8000/hooks"
    assert_url_refused(
        alice.api.post(
            "/api/v1/webhook-endpoints", {"url": url, "event_types": EVENTS}, format="json"
        )
    )
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    assert register(alice, url, EVENTS)["url"] == url


def test_is_public_address():
    import ipaddress

    public = ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "2a00:1450:4001:82b::200e"]
    assert all(webhook_transport.is_public_address(ipaddress.ip_address(a)) for a in public)


# --- connect time ------------------------------------------------------------------


def delivery_for(alice):
    payment_id = alice.schedule().json()["payment_id"]
    alice.api.delete(f"/api/v1/payments/{payment_id}/cancel")
    dispatched()
    return WebhookDelivery.objects.get()


def attempt_error(delivery):
    return WebhookAttempt.objects.filter(delivery=delivery).order_by("number").last().error


def test_dns_rebinding_is_refused_at_connect_time(alice, receiver, fake_dns, settings):
    """Public at registration, loopback when the worker connects: no request is made."""
    fake_dns["rebind.example.com"] = [PUBLIC_IP]
    url = f"http://rebind.example.com:{receiver.port}/hooks"
    register(alice, url, EVENTS)
    delivery = delivery_for(alice)
    fake_dns["rebind.example.com"] = ["127.0.0.1"]  # the attacker's DNS changes its answer
    assert webhooks.deliver(delivery.pk) == "pending"
    assert receiver.requests == []
    assert attempt_error(delivery) == "address_not_allowed"
    log = alice.api.get(f"/api/v1/webhook-endpoints/{delivery.endpoint_id}/deliveries").json()
    assert log["deliveries"][0]["last_error"] == "address_not_allowed"


def test_one_private_address_among_public_ones_refuses_the_delivery(alice, receiver, fake_dns):
    fake_dns["multi.example.com"] = [PUBLIC_IP]
    register(alice, f"http://multi.example.com:{receiver.port}/hooks", EVENTS)
    delivery = delivery_for(alice)
    fake_dns["multi.example.com"] = [PUBLIC_IP, "127.0.0.1"]
    assert webhooks.deliver(delivery.pk) == "pending"
    assert attempt_error(delivery) == "address_not_allowed" and receiver.requests == []


def test_connects_to_the_checked_address_without_a_second_lookup(
    alice, receiver, fake_dns, settings
):
    """The name resolves only through the checked lookup (the system resolver does
    not know it), yet the request arrives, with the name in the Host header."""
    settings.WEBHOOK_ALLOWED_HOSTS = ["relay.test"]
    fake_dns["relay.test"] = ["127.0.0.1"]
    register(alice, f"http://relay.test:{receiver.port}/hooks", EVENTS)
    delivery = delivery_for(alice)
    fake_dns.calls.clear()
    assert webhooks.deliver(delivery.pk) == "succeeded"
    assert fake_dns.calls == ["relay.test"]
    (headers, _, path) = receiver.requests[0]
    assert headers["Host"] == f"relay.test:{receiver.port}" and path == "/hooks"


def test_a_redirect_is_not_followed(alice, receiver):
    second = Receiver()
    try:
        receiver.answers = [(302, {"Location": second.url})]
        register(alice, receiver.url, EVENTS)
        delivery = delivery_for(alice)
        assert webhooks.deliver(delivery.pk) == "pending"
        assert len(receiver.requests) == 1 and second.requests == []
        assert attempt_error(delivery) == "redirect_not_followed"
        delivery.refresh_from_db()
        assert (delivery.last_status_code, delivery.last_error) == (302, "redirect_not_followed")
    finally:
        second.close()


@pytest.fixture
def tls_hooks_test(settings, fake_dns, tmp_path, monkeypatch):
    """``hooks.test`` (and ``wrong.test``) on 127.0.0.1, allowlisted, with a
    certificate for ``hooks.test`` that the webhook client trusts."""
    settings.WEBHOOK_ALLOWED_HOSTS = ["hooks.test", "wrong.test"]
    fake_dns["hooks.test"] = ["127.0.0.1"]
    fake_dns["wrong.test"] = ["127.0.0.1"]
    cert, key = self_signed(tmp_path, "hooks.test")
    client_context = ssl.create_default_context(cafile=cert)
    monkeypatch.setattr(webhook_transport, "ssl_context", lambda: client_context)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    return server_context


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_a_drip_feeding_endpoint_is_cut_off_at_the_total_budget(alice, settings, request, tls):
    """Every byte arrives well within the budget, the whole answer does not; over TLS
    too (the deadline holds through SSL reads)."""
    settings.WEBHOOK_TIMEOUT_SECONDS = 0.5
    options = (
        {"tls_context": request.getfixturevalue("tls_hooks_test"), "host": "hooks.test"}
        if tls
        else {}
    )
    drip = DripServer(length=40, interval=0.1, **options)  # 4 s for the status line and headers
    try:
        register(alice, drip.url, EVENTS)
        delivery = delivery_for(alice)
        assert webhooks.deliver(delivery.pk) == "pending"
        assert drip.requests == 1 and not drip.completed
        assert attempt_error(delivery) == "timeout"
    finally:
        drip.close()


def test_tls_uses_the_url_host_for_sni_and_certificate(alice, tls_hooks_test):
    """Connected to the pinned 127.0.0.1, TLS still names and verifies ``hooks.test``."""
    tls = Receiver(tls_context=tls_hooks_test, host_for_url="hooks.test")
    try:
        register(alice, tls.url, EVENTS)
        delivery = delivery_for(alice)
        assert webhooks.deliver(delivery.pk) == "succeeded"
        assert tls.sni_names == ["hooks.test"] and len(tls.requests) == 1
        # The same server under another name: its certificate does not match.
        endpoint = WebhookEndpoint.objects.get()
        endpoint.url = tls.url.replace("hooks.test", "wrong.test")
        endpoint.save(update_fields=["url"])
        payment_id = alice.schedule().json()["payment_id"]
        alice.api.delete(f"/api/v1/payments/{payment_id}/cancel")
        dispatched()
        second = WebhookDelivery.objects.exclude(pk=delivery.pk).get()
        assert webhooks.deliver(second.pk) == "pending"
        assert attempt_error(second) == "tls_error" and len(tls.requests) == 1
    finally:
        tls.close()


def test_http_endpoint_is_refused_at_connect_time_once_http_is_disallowed(
    alice, receiver, settings
):
    register(alice, receiver.url, EVENTS)
    delivery = delivery_for(alice)
    settings.WEBHOOK_ALLOW_HTTP = False
    assert webhooks.deliver(delivery.pk) == "pending"
    assert attempt_error(delivery) == "address_not_allowed" and receiver.requests == []


def test_a_hanging_dns_lookup_counts_against_the_budget(
    alice, receiver, fake_dns, settings, monkeypatch
):
    settings.WEBHOOK_TIMEOUT_SECONDS = 0.3
    fake_dns["slow.example.com"] = [PUBLIC_IP]
    register(alice, f"http://slow.example.com:{receiver.port}/hooks", EVENTS)
    delivery = delivery_for(alice)
    answer = webhook_transport.resolve
    release = threading.Event()

    def hanging_resolver(host, port):
        release.wait(30)
        return answer(host, port)

    monkeypatch.setattr(webhook_transport, "resolve", hanging_resolver)
    try:
        assert webhooks.deliver(delivery.pk) == "pending"
        assert attempt_error(delivery) == "timeout" and receiver.requests == []
        url = "https://slow.example.com/other"  # registration is bounded the same way
        assert_url_refused(
            alice.api.post(
                "/api/v1/webhook-endpoints", {"url": url, "event_types": EVENTS}, format="json"
            )
        )
    finally:
        release.set()
