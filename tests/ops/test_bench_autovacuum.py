"""The benchmark turns PostgreSQL's autovacuum on for a run and puts the server back.

``bench/run.py --autovacuum on`` (the default) runs the scenarios as a
production server runs: the CI server this box shares has autovacuum off. What
it sends is ``bench.harness.db.autovacuum_switch``'s; a slip here would leave
the shared server changed after the run, or leave the run measuring a server
nobody deploys.
"""

from __future__ import annotations

import pytest

from bench.harness.db import autovacuum_switch

RELOAD = "SELECT pg_reload_conf()"


def test_a_server_without_autovacuum_gets_it_for_the_run_and_its_files_decide_after():
    assert autovacuum_switch("on", "off", in_auto_conf=False) == (
        ["ALTER SYSTEM SET autovacuum = on", RELOAD],
        ["ALTER SYSTEM RESET autovacuum", RELOAD],
    )


def test_a_value_alter_system_had_set_is_set_again():
    assert autovacuum_switch("on", "off", in_auto_conf=True) == (
        ["ALTER SYSTEM SET autovacuum = on", RELOAD],
        ["ALTER SYSTEM SET autovacuum = off", RELOAD],
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
