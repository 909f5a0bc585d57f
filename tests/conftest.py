import os

import pytest

from tests.factories import AccountFactory

if os.environ.get("MUTATION_SESSION"):  # scripts/mutation: one fresh database per session
    from tests.mutation_session import django_db_setup  # noqa: F401


@pytest.fixture(autouse=True)
def _empty_collapse_quarantine():
    """The executor's quarantine is per process (``executor.Quarantine``): a
    test's failed batch must not keep payments out of the next test's collapses."""
    from payments.engine import executor

    executor.quarantine.clear()
    yield
    executor.quarantine.clear()


@pytest.fixture
def funded_account(db):
    return AccountFactory(funded=10_000)


@pytest.fixture
def private_redis(tmp_path):
    """A ``redis-server`` of the test's own (``tests.processes.PrivateRedis``), killed after."""
    import shutil

    from tests.processes import PrivateRedis

    if not shutil.which("redis-server"):
        pytest.skip("needs the redis-server binary")
    server = PrivateRedis(tmp_path)
    try:
        server.start()
        yield server
    finally:
        server.kill()


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.postgres`` tests (query plans, PostgreSQL triggers, processes
    on the suite's PostgreSQL database) are skipped on the SQLite run."""
    from django.conf import settings

    if settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL (the SQLite run covers the rest)")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report on the test item (``item.rep_call``…), so fixtures can
    tell whether the test failed (the process fixtures print logs then)."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
