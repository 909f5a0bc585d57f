"""The benchmark sets PostgreSQL's autovacuum and max_wal_size for a run and puts
the server back.

``bench/run.py --autovacuum on`` (the default) runs the scenarios as a
production server runs: the CI server this box shares has autovacuum off. What
it sends is ``bench.harness.db.autovacuum_switch``'s; a slip here would leave
the shared server changed after the run, or leave the run measuring a server
nobody deploys.
"""

from __future__ import annotations

import pytest

from bench.harness.db import autovacuum_switch, max_wal_size_switch

RELOAD = "SELECT pg_reload_conf()"


def test_a_server_without_autovacuum_gets_it_for_the_run_and_its_files_decide_after():
    assert autovacuum_switch("on", "off", in_auto_conf=False) == (
        ["ALTER SYSTEM SET autovacuum = 'on'", RELOAD],
        ["ALTER SYSTEM RESET autovacuum", RELOAD],
    )


def test_a_value_alter_system_had_set_is_set_again():
    assert autovacuum_switch("on", "off", in_auto_conf=True) == (
        ["ALTER SYSTEM SET autovacuum = 'on'", RELOAD],
        ["ALTER SYSTEM SET autovacuum = 'off'", RELOAD],
    )


@pytest.mark.parametrize("in_auto_conf", [False, True])
def test_a_server_with_autovacuum_is_left_alone(in_auto_conf):
    assert autovacuum_switch("on", "on", in_auto_conf) == ([], [])


@pytest.mark.parametrize("before", ["on", "off"])
def test_server_leaves_the_server_as_configured(before):
    assert autovacuum_switch("server", before, in_auto_conf=False) == ([], [])


def test_anything_else_is_refused():
    with pytest.raises(ValueError, match="autovacuum"):
        autovacuum_switch("off", "on", in_auto_conf=False)


def test_the_run_s_max_wal_size_and_back():
    assert max_wal_size_switch("8GB", "1GB", in_auto_conf=False) == (
        ["ALTER SYSTEM SET max_wal_size = '8GB'", RELOAD],
        ["ALTER SYSTEM RESET max_wal_size", RELOAD],
    )
    assert max_wal_size_switch("8GB", "2GB", in_auto_conf=True) == (
        ["ALTER SYSTEM SET max_wal_size = '8GB'", RELOAD],
        ["ALTER SYSTEM SET max_wal_size = '2GB'", RELOAD],
    )


@pytest.mark.parametrize(("wanted", "before"), [("8GB", "8GB"), ("server", "1GB")])
def test_max_wal_size_already_so_or_server_is_left_alone(wanted, before):
    assert max_wal_size_switch(wanted, before, in_auto_conf=False) == ([], [])


@pytest.mark.parametrize("wanted", ["8 GB", "8GB; DROP TABLE x", "", "lots"])
def test_a_max_wal_size_that_is_not_a_size_is_refused(wanted):
    with pytest.raises(ValueError, match="max_wal_size"):
        max_wal_size_switch(wanted, "1GB", in_auto_conf=False)


def test_a_setting_that_fails_to_apply_puts_back_those_applied_before_it(monkeypatch):
    """The shared server must not keep the run's autovacuum because max_wal_size's
    ALTER SYSTEM failed after it."""
    import contextlib

    import psycopg

    from bench.harness.db import server_settings

    sent = []

    class Server:
        def execute(self, statement, params=None):
            if statement.startswith("\nSELECT current_setting"):
                before = {"autovacuum": "off", "max_wal_size": "1GB"}[params[0]]
                return type("Row", (), {"fetchone": lambda self: (before, False)})()
            if "max_wal_size = '8GB'" in statement:
                raise psycopg.errors.InsufficientPrivilege("refused")
            sent.append(statement)

    @contextlib.contextmanager
    def connect(*args, **kwargs):
        yield Server()

    monkeypatch.setattr(psycopg, "connect", connect)
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege),
        server_settings(autovacuum="on", max_wal_size="8GB"),
    ):
        pytest.fail("the run started")
    assert sent == [
        "ALTER SYSTEM SET autovacuum = 'on'",
        RELOAD,
        "ALTER SYSTEM RESET max_wal_size",
        RELOAD,
        "ALTER SYSTEM RESET autovacuum",
        RELOAD,
    ]


# ---------------------------------------------------------------- commit times
RESTART = "-- restart the server"


def test_commit_timestamps_restart_the_server_to_take_and_to_put_back():
    """track_commit_timestamp is read at server start only: a reload would leave
    the run without it (and the harness reading NULLs)."""
    from bench.harness.db import RESTART as marker
    from bench.harness.db import commit_timestamps_switch

    assert marker == RESTART
    assert commit_timestamps_switch("on", "off", in_auto_conf=False) == (
        ["ALTER SYSTEM SET track_commit_timestamp = 'on'", RESTART],
        ["ALTER SYSTEM RESET track_commit_timestamp", RESTART],
    )
    assert commit_timestamps_switch("on", "on", in_auto_conf=False) == ([], [])
    assert commit_timestamps_switch("server", "off", in_auto_conf=False) == ([], [])
    with pytest.raises(ValueError, match="commit timestamps"):
        commit_timestamps_switch("off", "on", in_auto_conf=False)


def _fake_server(monkeypatch, before: dict[str, str], sent: list[str]):
    import contextlib

    import psycopg

    from bench.harness import db

    class Server:
        def execute(self, statement, params=None):
            if statement.startswith("\nSELECT current_setting"):
                value = before[params[0]]
                return type("Row", (), {"fetchone": lambda self: (value, False)})()
            sent.append(statement)

    @contextlib.contextmanager
    def connect(*args, **kwargs):
        yield Server()

    monkeypatch.setattr(psycopg, "connect", connect)
    monkeypatch.setattr(db, "restart_server", lambda: sent.append(RESTART))


def test_the_run_restarts_once_to_take_commit_times_and_once_after_everything_is_put_back(
    monkeypatch,
):
    from bench.harness import db

    sent: list[str] = []
    _fake_server(
        monkeypatch,
        {"autovacuum": "off", "max_wal_size": "1GB", "track_commit_timestamp": "off"},
        sent,
    )
    monkeypatch.setattr(db, "local_cluster", lambda: ["pg_ctlcluster"])
    with db.server_settings(autovacuum="on", max_wal_size="8GB", track_commit_timestamp="on"):
        assert sent == [
            "ALTER SYSTEM SET autovacuum = 'on'",
            RELOAD,
            "ALTER SYSTEM SET max_wal_size = '8GB'",
            RELOAD,
            "ALTER SYSTEM SET track_commit_timestamp = 'on'",
            RESTART,
        ]
        sent.clear()
    assert sent == [
        "ALTER SYSTEM RESET track_commit_timestamp",
        "ALTER SYSTEM RESET max_wal_size",
        "ALTER SYSTEM RESET autovacuum",
        RESTART,
    ]


def test_a_server_the_harness_cannot_restart_is_refused_before_anything_changes(monkeypatch):
    from bench.harness import db

    sent: list[str] = []
    _fake_server(monkeypatch, {"autovacuum": "off", "track_commit_timestamp": "off"}, sent)
    monkeypatch.setattr(db, "PG_SERVER", "postgres://bench@db.example:5432")
    with (
        pytest.raises(RuntimeError, match="not this host's"),
        db.server_settings(autovacuum="on", track_commit_timestamp="on"),
    ):
        pytest.fail("the run started")
    assert sent == []


def test_auto_commit_timestamps_fall_back_to_the_server_as_configured(monkeypatch, capsys):
    from bench import run

    def cannot():
        raise RuntimeError("no Debian PostgreSQL cluster (pg_ctlcluster) on this host")

    monkeypatch.setattr(run, "local_cluster", cannot)
    assert run.commit_timestamps("auto") == "server"
    assert "not recorded" in capsys.readouterr().out
    assert run.commit_timestamps("on") == "on"
    monkeypatch.setattr(run, "local_cluster", lambda: ["pg_ctlcluster"])
    assert run.commit_timestamps("auto") == "on"


@pytest.mark.django_db(transaction=True)  # a committed row: an open transaction has no time
def test_commit_times_read_as_the_server_records_them():
    """The capacity scenario's query runs on any server: NULL where commit times
    are not recorded (pg_xact_commit_timestamp raises there), a time where they are."""
    from bench.harness.clock import commit_timestamps_on, committed_at
    from ledger.models import Account
    from tests.factories import AccountFactory

    AccountFactory()
    (committed,) = Account.objects.annotate(c=committed_at("ledger_account")).values_list(
        "c", flat=True
    )
    assert (committed is not None) == commit_timestamps_on()
