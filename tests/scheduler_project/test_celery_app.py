"""The Celery application's process hooks (``scheduler_project.celery``)."""

import gc

import pytest
from celery.signals import worker_process_init, worker_ready


@pytest.fixture
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.mark.parametrize("signal", [worker_process_init, worker_ready], ids=lambda s: s.name)
def test_a_worker_leaves_what_it_loaded_out_of_full_collections(unfrozen, signal):
    """A pool process after the fork, and a worker once ready, freeze the objects
    loaded so far: full collections no longer walk Django, the app and Celery."""
    import scheduler_project.celery  # noqa: F401 - the handlers connect on import

    assert gc.get_freeze_count() == 0
    signal.send(sender=None)
    assert gc.get_freeze_count() > 10_000


@pytest.mark.django_db(transaction=True)
def test_a_healthy_idle_connection_skips_the_select_1_round_trip():
    """Between tasks an idle connection whose socket is quiet counts as checked:
    no ``SELECT 1`` before the next task's first query."""
    from django.db import connection

    from scheduler_project.celery import _recycle_db_connections

    connection.ensure_connection()
    _recycle_db_connections()
    assert connection.health_check_done is True
    with connection.cursor() as cursor:  # no check on first use: the same session answers
        cursor.execute("SELECT 1")


@pytest.mark.django_db(transaction=True)
def test_a_terminated_backend_is_replaced_before_the_task_uses_it():
    """A backend killed between tasks (pg_terminate_backend, a server restart) has
    said so on its socket: the connection goes through Django's check, which
    closes it, and the task's first query runs on a new one, with no error."""
    import time

    from django.db import connection

    from scheduler_project.celery import _recycle_db_connections, socket_is_quiet
    from tests.concurrency import in_other_connection

    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (old,) = cursor.fetchone()
    assert in_other_connection("SELECT pg_terminate_backend(%s)", [old]) is None
    deadline = time.monotonic() + 10
    while socket_is_quiet(connection.connection) and time.monotonic() < deadline:
        time.sleep(0.01)

    _recycle_db_connections()

    assert connection.health_check_done is False
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != old


@pytest.mark.django_db
def test_a_connection_inside_a_transaction_is_not_called_quiet():
    from django.db import connection

    from scheduler_project.celery import socket_is_quiet

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")  # the test's transaction has begun
    assert socket_is_quiet(connection.connection) is False


@pytest.fixture
def beat_signal_handlers():
    import signal

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_beat_stopped_mid_tick_does_not_save_its_schedule_inside_the_signal_handler(
    beat_signal_handlers, name
):
    """Celery's handler saved the schedule inside the handler, and the
    DatabaseScheduler's save closed the connection under the query the signal
    had interrupted: beat logged CRITICAL with a traceback when stopped
    mid-tick (``tests/ops/test_dev_script.py``, once in a while). Once beat
    has started (``beat_init``) a stop only raises ``SystemExit``: the query
    unwinds with its connection open and ``beat.Service.start`` saves the
    schedule in its ``finally``."""
    import signal

    from celery import platforms
    from celery.apps.beat import Beat
    from celery.signals import beat_init

    import scheduler_project.celery  # noqa: F401 - the handlers connect on import

    class Service:
        synced = 0

        def sync(self):
            self.synced += 1

    service = Service()
    Beat.install_sync_handler(None, service)  # what celery beat installs first
    beat_init.send(sender=service)  # then Service.start sends this
    handler = signal.getsignal(getattr(signal, name))
    with pytest.raises(SystemExit):
        handler(getattr(signal, name), None)
    assert service.synced == 0
    assert platforms.signals[name] is handler
