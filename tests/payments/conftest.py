import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from payments.models import ApiTokenVia
from payments.tokens import api_token_issue
from tests.factories import AccountFactory, UserFactory


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
