import pytest

from tests.factories import AccountFactory


@pytest.fixture
def funded_account(db):
    return AccountFactory(funded=10_000)
