import ipaddress
import socket

import pytest
from django.contrib.auth.models import Group
from django.core.cache import cache
from rest_framework.test import APIClient

from payments import webhook_transport
from payments.models import ApiTokenVia
from payments.tokens import api_token_issue
from tests.factories import AccountFactory, UserFactory
from tests.payments.webhook_receivers import Receiver


class Client:
    """An API client: its user, two funded accounts and an authenticated APIClient."""

    def __init__(self, username: str, balance: int = 10_000):
        self.user = UserFactory(username=username)
        self.account = AccountFactory(owner=self.user, funded=balance)
        self.other_account = AccountFactory(owner=self.user)
        _, self.token = api_token_issue(user=self.user, actor=None, via=ApiTokenVia.CLI)
        self.api = APIClient()
        self.api.credentials(HTTP_AUTHORIZATION=f"Bearer {self.token}")

    def schedule(self, headers=None, **overrides):
        body = {
            "from_account_id": self.account.pk,
            "to_account_id": self.other_account.pk,
            "amount": 100,
            "delay_seconds": 60,
        } | overrides
        return self.api.post(
            "/api/v1/payments/schedule", body, format="json", headers=headers or {}
        )


@pytest.fixture(autouse=True)
def _clear_throttle_cache():
    cache.clear()


@pytest.fixture
def alice(db):
    return Client("alice")


@pytest.fixture
def bob(db):
    return Client("bob")


@pytest.fixture(autouse=True)
def _webhooks_stay_on_this_machine(monkeypatch):
    """A webhook request from a test may only ever connect to a loopback address:
    a broken address rule must fail the test, not send traffic elsewhere."""
    real_connect = webhook_transport._DeadlineSocket.connect

    def connect(sock, address):
        if not ipaddress.ip_address(address[0]).is_loopback:
            raise AssertionError(f"a test webhook tried to connect to {address[0]}")
        return real_connect(sock, address)

    monkeypatch.setattr(webhook_transport._DeadlineSocket, "connect", connect)


class FakeDNS(dict):
    """Host name → IP strings answered by ``webhook_transport.resolve`` (other
    names go to the real resolver); ``calls`` lists every name looked up."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []


@pytest.fixture
def fake_dns(monkeypatch):
    dns = FakeDNS()
    real_resolve = webhook_transport.resolve

    def resolve(host, port):
        dns.calls.append(host)
        if host not in dns:
            return real_resolve(host, port)
        return [
            (socket.AF_INET6, (ip, port, 0, 0)) if ":" in ip else (socket.AF_INET, (ip, port))
            for ip in dns[host]
        ]

    monkeypatch.setattr(webhook_transport, "resolve", resolve)
    return dns


@pytest.fixture(autouse=True)
def _fresh_webhook_shares(monkeypatch):
    """Each test starts with no client's requests in flight or turns reserved."""
    from payments import webhooks

    monkeypatch.setattr(webhooks, "_client_shares", webhooks._ClientShares())


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def dispatched() -> None:
    """What the webhook worker does after the commit a test cannot reach (its outer
    transaction never commits): expand every outbox event into its deliveries."""
    from payments import webhooks
    from payments.models import WebhookEvent

    webhooks.dispatch(
        WebhookEvent.objects.filter(dispatched_at__isnull=True).values_list("pk", flat=True)
    )


@pytest.fixture
def accounts(db):
    """Two account ids of one client: a funded source and a target."""
    owner = UserFactory()
    return AccountFactory(owner=owner, funded=1_000).pk, AccountFactory(owner=owner).pk


@pytest.fixture
def support(client):
    """The test client logged in as ``sam``, a staff user of the Support group."""
    user = UserFactory(username="sam", is_staff=True)
    user.groups.add(Group.objects.get(name="Support"))
    client.force_login(user)
    client.user = user
    return client
