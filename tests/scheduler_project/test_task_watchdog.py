"""Task time limits in a solo-pool worker (``scheduler_project.task_watchdog``), and
libpq's client-side limits on the database connection (settings ``DATABASES``)."""

from __future__ import annotations

import os
import signal
import socket
from types import SimpleNamespace

import psycopg
import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.db import connection

import scheduler_project.celery as celery_app
from scheduler_project.task_watchdog import TaskWatchdog
from tests.network import TcpProxy

# These tests take SIGALRM for the watchdog, which pytest-timeout's default
# method also uses: a hang here must still end, so the timeout runs on a thread.
pytestmark = pytest.mark.timeout(60, method="thread")


@pytest.fixture
def watchdog():
    made = []

    def make(soft, hard=None, **kwargs):
        dog = TaskWatchdog(soft, hard, **kwargs)
        made.append(dog)
        return dog

    yield make
    for dog in made:
        dog.stop()


@pytest.fixture
def silent_database():
    """A psycopg connection, made with Django's parameters, through a proxy that can
    go silent."""
    db = connection.settings_dict
    proxy = TcpProxy(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))
    proxy.open()
    params = connection.get_connection_params() | {"host": "127.0.0.1", "port": proxy.port}
    conn = psycopg.connect(**params)
    yield conn, proxy
    proxy.close()
    conn.close()


@pytest.mark.django_db
def test_the_soft_limit_ends_a_pipeline_the_database_never_answers(watchdog, silent_database):
    """The executor's statements run in a pipeline, whose end waits for the server's
    results: interrupted inside one, the task must not wait there again on the way
    out. The handler drops the socket first (``before_interrupt``), so the
    pipeline ends at once and the exception reaches the task."""
    conn, proxy = silent_database
    dog = watchdog(soft=0.3, before_interrupt=conn.pgconn.finish)
    dog.start()
    dog.task_started("payments.execute_chunk")
    proxy.silence()

    with pytest.raises(SoftTimeLimitExceeded), conn.pipeline():
        conn.execute("SELECT 2")
        conn.execute("SELECT 3").fetchone()

    assert conn.closed


@pytest.mark.django_db(transaction=True)
def test_dropped_database_sockets_are_replaced_at_the_next_task():
    from django.db import connection

    from scheduler_project.celery import _recycle_db_connections, drop_database_sockets

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (old,) = cursor.fetchone()
    drop_database_sockets()
    _recycle_db_connections()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != old


@pytest.mark.django_db
def test_the_soft_limit_interrupts_a_query_the_database_never_answers(watchdog, silent_database):
    """The database host vanished mid-task: the query's wait ends at the soft limit
    with Celery's SoftTimeLimitExceeded (a transient error to the payment task)
    instead of the kernel's ~2 hours; the connection is not reused."""
    conn, proxy = silent_database
    assert conn.execute("SELECT 1").fetchone() == (1,)
    dog = watchdog(soft=0.3)
    dog.start()
    dog.task_started("payments.execute_chunk")
    proxy.silence()

    with pytest.raises(SoftTimeLimitExceeded):
        conn.execute("SELECT 2")

    dog.task_finished()
    with pytest.raises(psycopg.OperationalError):  # Django drops such a connection
        conn.execute("SELECT 3")


def test_a_task_that_ended_in_time_is_left_alone(watchdog):
    dog = watchdog(soft=10, hard=20)
    dog.start()
    dog.task_started("payments.execute_chunk")
    dog.task_finished()
    dog.check(float("inf"))  # nothing running: no signal, no exit

    dog.task_started("payments.execute_chunk")
    dog.check(dog._task[2] + 9.9)
    assert dog._signalled is None


def test_a_signal_for_a_task_that_has_since_ended_raises_nothing(watchdog):
    """The limit hit task 1; by the time the signal arrives task 1 has ended and
    task 2 runs: task 2 must not be interrupted."""
    dog = watchdog(soft=10)
    dog.task_started("first")
    dog._signalled = dog._task[0]  # the watcher's decision for task 1...
    dog.task_finished()
    dog.task_started("second")
    dog._on_soft_limit(signal.SIGALRM, None)  # ...arrives during task 2: ignored

    dog.task_finished()
    dog._on_soft_limit(signal.SIGALRM, None)  # or between tasks: ignored


def test_the_soft_limit_fires_once_per_task(watchdog, monkeypatch):
    sent = []
    monkeypatch.setattr(signal, "pthread_kill", lambda ident, sig: sent.append(sig))
    dog = watchdog(soft=10, hard=30)
    dog.task_started("payments.execute_chunk")
    started = dog._task[2]
    dog.check(started + 10)
    dog.check(started + 11)
    assert sent == [signal.SIGALRM]
    with pytest.raises(SoftTimeLimitExceeded):
        dog._on_soft_limit(signal.SIGALRM, None)


def test_past_the_hard_limit_the_worker_exits(watchdog, monkeypatch):
    """Stuck where no handler runs: the process exits unacknowledged (the broker
    delivers the message again, the supervisor starts a new worker)."""
    exits = []
    monkeypatch.setattr(os, "_exit", exits.append)
    monkeypatch.setattr(signal, "pthread_kill", lambda ident, sig: None)
    dog = watchdog(soft=90, hard=120)
    dog.task_started("payments.execute_chunk")
    started = dog._task[2]
    dog.check(started + 119)
    assert exits == []
    dog.check(started + 120)
    assert exits == [1]


@pytest.mark.parametrize(
    ("pool", "watched"), [("solo", True), ("prefork", False), ("threads", False)]
)
def test_only_a_solo_worker_watches_its_tasks(monkeypatch, pool, watched):
    """Prefork enforces the limits itself; threads cannot interrupt a thread."""
    monkeypatch.setattr(celery_app, "_watchdog", None)
    started = []
    monkeypatch.setattr(TaskWatchdog, "start", lambda self: started.append(self))

    celery_app._watch_solo_tasks(sender=SimpleNamespace(pool_cls=pool))

    assert bool(started) is watched
    if watched:
        assert (started[0].soft, started[0].hard) == (90, 120)  # settings CELERY_TASK_*
        assert started[0].before_interrupt is celery_app.drop_database_sockets


def test_database_connections_carry_client_side_limits():
    params = connection.get_connection_params()
    assert {k: params[k] for k in ("keepalives", "keepalives_idle", "tcp_user_timeout")} == {
        "keepalives": 1,
        "keepalives_idle": 30,
        "tcp_user_timeout": 60_000,
    }
    assert params["connect_timeout"] == 10


def test_connecting_to_a_server_that_never_answers_gives_up(monkeypatch):
    """A listener that accepts and says nothing (a hung host): connecting fails at
    connect_timeout instead of waiting for good."""
    silent = socket.create_server(("127.0.0.1", 0))
    params = connection.get_connection_params() | {
        "host": "127.0.0.1",
        "port": silent.getsockname()[1],
        "connect_timeout": 2,  # the setting's 10 s, shortened for the test
    }
    try:
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(**params)
    finally:
        silent.close()


def test_a_soft_limit_is_not_taken_for_a_payments_fault():
    """Every statement is cut at PAYMENT_BATCH_TIMEOUT_SECONDS (30 s) first, so a
    batch at the 90 s soft limit waited on a stuck database or network: its
    collapsed payments are not quarantined, and the chunk retries with backoff."""
    from payments.engine.executor import payments_fault
    from payments.tasks import TRANSIENT

    assert payments_fault(SoftTimeLimitExceeded()) is False
    assert isinstance(SoftTimeLimitExceeded(), TRANSIENT)
    assert payments_fault(ValueError()) is True


def test_a_limit_raised_while_a_task_ends_leaves_it_ended(monkeypatch):
    """The soft limit's exception can land in the post-run hook itself (the task
    ended at about 90 s): the task must be recorded as ended before anything
    there can raise, or the hard limit would end an idle worker 30 s later."""
    dog = TaskWatchdog(90, 120)
    monkeypatch.setattr(celery_app, "_watchdog", dog)

    def interrupted():
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(celery_app, "_recycle_db_connections", interrupted)
    task = SimpleNamespace(name="payments.execute_chunk", request=SimpleNamespace(is_eager=False))
    dog.task_started(task.name)
    with pytest.raises(SoftTimeLimitExceeded):
        celery_app._task_ends(task=task)
    assert dog._task is None


def test_a_stuck_log_handler_does_not_stop_the_limits(watchdog, monkeypatch):
    """The main thread stuck writing a log record holds its handler's lock: the
    watchdog still signals, and still exits, without waiting on that lock."""
    import logging
    import threading

    exits, sent = [], []
    monkeypatch.setattr(os, "_exit", exits.append)
    monkeypatch.setattr(signal, "pthread_kill", lambda ident, sig: sent.append(sig))

    class Quiet(logging.Handler):
        def emit(self, record):
            pass

    handler = Quiet()
    logger = logging.getLogger("scheduler_project.task_watchdog")
    logger.addHandler(handler)
    handler.acquire()  # held, as by a main thread blocked in emit()
    try:
        dog = watchdog(soft=90, hard=120)
        dog.task_started("payments.execute_chunk")
        started = dog._task[2]
        checked = threading.Thread(
            target=lambda: (dog.check(started + 90), dog.check(started + 120))
        )
        checked.start()
        checked.join(15)
        assert not checked.is_alive()
        assert sent == [signal.SIGALRM] and exits == [1]
        # the log writers still wait on the lock: daemons, or a worker shutting
        # down later would wait for them for good
        writers = _log_writers()
        assert writers and all(t.daemon for t in writers)
    finally:
        handler.release()
        # the writers log now that the lock is free: here, not into a later test
        for writer in _log_writers():
            writer.join(5)
        logger.removeHandler(handler)


@pytest.fixture
def clock(monkeypatch):
    """The watchdog's monotonic clock held at 1000.0, so a limit is reached exactly."""
    import scheduler_project.task_watchdog as module

    # the module's own name for the time module: the process's clock is left alone
    monkeypatch.setattr(module, "time", SimpleNamespace(monotonic=lambda: 1000.0))
    return 1000.0


def test_each_limit_acts_when_it_is_reached_not_after(watchdog, monkeypatch, clock):
    exits, sent = [], []
    monkeypatch.setattr(os, "_exit", exits.append)
    monkeypatch.setattr(signal, "pthread_kill", lambda ident, sig: sent.append(sig))
    dog = watchdog(soft=90, hard=120)
    dog.task_started("payments.execute_chunk")
    dog.check(clock + 90)
    assert (sent, exits) == ([signal.SIGALRM], [])
    dog.check(clock + 120)
    assert exits == [1]


def test_the_thread_sleeps_until_the_next_limit_and_never_past_the_shorter_one(watchdog, clock):
    """No tick: idle, the thread sleeps the shorter limit (a task starting during
    the sleep reaches its own limit after the wake); with a task running, until
    that task's next limit not yet acted on, capped the same way."""
    dog = watchdog(soft=90, hard=300)
    assert dog.next_wait(clock) == 90  # nothing running
    dog.task_started("payments.execute_chunk")  # started at ``clock``
    assert dog.next_wait(clock + 60) == 30  # its soft limit
    assert dog.next_wait(clock + 95) == 0  # reached and not yet acted on: at once
    dog._signalled = dog._task[0]
    # soft acted on: the hard limit is 205 s away, but a task starting now could
    # reach its soft limit in 90
    assert dog.next_wait(clock + 95) == 90
    assert dog.next_wait(clock + 250) == 50  # the hard limit, sooner than 90
    dog.task_finished()
    assert dog.next_wait(clock + 250) == 90
    # the next task's soft limit is its own: the first one's signal is no reason to skip it
    dog.task_started("payments.execute_chunk")  # started at ``clock`` too (the clock is held)
    assert dog.next_wait(clock + 60) == 30


@pytest.mark.parametrize(
    ("soft", "hard", "idle"), [(90, None, 90), (None, 120, 120), (200, 120, 120)]
)
def test_with_one_limit_or_the_hard_one_shorter_the_waits_follow_it(
    watchdog, clock, soft, hard, idle
):
    dog = watchdog(soft=soft, hard=hard)
    assert dog.next_wait(clock) == idle
    dog.task_started("payments.execute_chunk")
    # the running task's first limit: hard at 120, or soft at 90 (already reached)
    assert dog.next_wait(clock + 100) == (0 if soft == 90 else 20)


def test_a_task_started_while_the_thread_sleeps_is_still_interrupted(watchdog):
    """The thread went to sleep with nothing running (for the whole soft limit);
    a task that starts during that sleep is still interrupted (the thread wakes
    before the task's limit and then sleeps until it)."""
    import time

    dog = watchdog(soft=0.5)
    dog.start()
    time.sleep(0.3)  # the thread is asleep for 0.5 s from its start
    dog.task_started("payments.execute_chunk")
    with pytest.raises(SoftTimeLimitExceeded):
        time.sleep(5)  # the interrupt lands here (or the test fails after 5 s)
    dog.task_finished()


def test_the_limits_are_logged_with_the_task_and_the_limit(watchdog, monkeypatch, clock, caplog):
    """Support reads these lines to find which task a worker gave up on and why."""
    import logging

    monkeypatch.setattr(os, "_exit", lambda code: None)
    monkeypatch.setattr(signal, "pthread_kill", lambda ident, sig: None)
    dog = watchdog(soft=90, hard=120)
    dog.task_started("payments.execute_chunk")
    with caplog.at_level(logging.INFO, logger="scheduler_project.task_watchdog"):
        dog.check(clock + 90)
        dog.check(clock + 120)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.ERROR, "task payments.execute_chunk ran past its soft time limit (90 s)"),
        (
            logging.CRITICAL,
            "task payments.execute_chunk ran past its hard time limit (120 s); "
            "this solo worker exits",
        ),
    ]


def test_the_interrupt_says_which_limit(watchdog):
    dog = watchdog(soft=90)
    dog.task_started("payments.execute_chunk")
    dog._signalled = dog._task[0]
    with pytest.raises(SoftTimeLimitExceeded, match=r"soft time limit \(90 s\) exceeded"):
        dog._on_soft_limit(signal.SIGALRM, None)


def test_before_the_first_task_there_is_nothing_to_watch(watchdog, monkeypatch):
    monkeypatch.setattr(os, "_exit", lambda code: pytest.fail("exited"))
    monkeypatch.setattr(signal, "pthread_kill", lambda ident, sig: pytest.fail("signalled"))
    watchdog(soft=90, hard=120).check(float("inf"))


def _threads_named(test):
    import threading

    return [t for t in threading.enumerate() if test(t.name)]


def _watching_threads():
    return _threads_named(lambda name: name == "task-watchdog")


def _log_writers():
    """``_log_briefly``'s threads (Python names a thread after its target)."""
    return _threads_named(lambda name: name.endswith("(log)"))


def test_one_named_daemon_thread_which_gives_sigalrm_back(watchdog):
    """Named so it shows as itself in py-spy and thread dumps; a daemon, since a
    worker never stops it and must not wait for it at exit; started once."""
    before = signal.getsignal(signal.SIGALRM)
    dog = watchdog(soft=90, hard=120)
    dog.start()
    dog.start()
    assert len(_watching_threads()) == 1
    assert dog._thread.daemon
    assert signal.getsignal(signal.SIGALRM) == dog._on_soft_limit
    dog.stop()
    assert _watching_threads() == []
    assert signal.getsignal(signal.SIGALRM) == before


@pytest.mark.parametrize("limit", [0, -5, None])
def test_a_limit_that_is_not_positive_is_no_limit(watchdog, monkeypatch, clock, limit):
    """A negative setting would otherwise signal every task at once and, with no
    positive limit to wait for, leave the thread nothing to sleep on."""
    monkeypatch.setattr(signal, "pthread_kill", lambda ident, sig: pytest.fail("signalled"))
    dog = watchdog(soft=limit, hard=120)
    assert dog.soft is None
    dog.task_started("payments.execute_chunk")
    dog.check(clock + 100)
    assert dog.next_wait(clock + 100) == 20


def test_a_negative_hard_limit_is_no_limit(watchdog, monkeypatch, clock):
    monkeypatch.setattr(os, "_exit", lambda code: pytest.fail("exited"))
    monkeypatch.setattr(signal, "pthread_kill", lambda ident, sig: None)
    dog = watchdog(soft=90, hard=-5)
    assert dog.hard is None
    dog.task_started("payments.execute_chunk")
    dog.check(clock + 100)


def test_a_limit_under_a_second_is_kept():
    assert (TaskWatchdog(0.5, 0.75).soft, TaskWatchdog(0.5, 0.75).hard) == (0.5, 0.75)


def test_without_limits_nothing_is_started(watchdog):
    before = signal.getsignal(signal.SIGALRM)
    watchdog(soft=None, hard=None).start()
    watchdog(soft=-1, hard=0).start()
    assert _watching_threads() == []
    assert signal.getsignal(signal.SIGALRM) == before
