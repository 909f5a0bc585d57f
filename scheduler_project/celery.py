"""Celery application shared by web (publisher), beat and workers."""

import gc
import os
import select
import warnings

from celery import Celery, platforms
from celery.exceptions import SecurityWarning
from celery.signals import (
    beat_init,
    celeryd_init,
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
)

from .metrics_files import mark_process_dead
from .task_watchdog import TaskWatchdog

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings.base")

app = Celery("scheduler_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@beat_init.connect
def _stop_beat_between_ticks(sender=None, **kwargs):
    """Beat's SIGTERM/SIGINT handler: stop, and let beat save its schedule on the way out.

    Celery's own handler saves the schedule inside the signal handler
    (``service.sync()``), which for django-celery-beat's DatabaseScheduler
    starts with ``close_old_connections()`` — closing the database connection
    under the query the signal interrupted. The interrupted query then fails
    on a closed connection instead of unwinding, and beat logs CRITICAL with a
    traceback on every such stop (seen on SQLite, ``scripts/dev`` stopped
    mid-tick; the same class as celery/celery#4771). ``beat.Service.start``
    already saves the schedule in its ``finally`` once the exit has unwound
    the query, so the handler only has to raise. Installed by ``beat_init``,
    which ``Service.start`` sends after Celery installed its own handler.
    """

    def stop(signum, frame):
        raise SystemExit()

    platforms.signals.update(SIGTERM=stop, SIGINT=stop)


@worker_process_init.connect
@worker_ready.connect
def _freeze_loaded_objects(**kwargs):
    """Leave what the worker loaded before its first task (Django, the app, Celery
    — ~100,000 objects) out of the garbage collector's full collections
    (``gc.freeze``): in a pool process after the fork, in the main process (and a
    threads-pool worker's) once ready. Executing payments allocates enough that
    CPython runs a full collection every ~1,000 of them, and each walked every
    one of those objects: ~30 ms, a fifth of a payment's CPU in a batch
    (0.031-0.036 of 0.15-0.16 ms; frozen, 0.0007). The frozen objects live as
    long as the process anyway; a prefork child also stops dirtying the pages
    it shares with its parent to mark them."""
    gc.freeze()


@worker_process_shutdown.connect
def _mark_metrics_process_dead(pid=None, **kwargs):
    """Multiprocess Prometheus: drop a dead pool process's live gauges."""
    mark_process_dead(pid or os.getpid())


_watchdog: TaskWatchdog | None = None


@worker_init.connect
def _watch_solo_tasks(sender=None, **kwargs):
    """A solo-pool worker enforces the task time limits itself (``task_watchdog``):
    Celery does so only in prefork pools."""
    from celery.concurrency import get_implementation
    from celery.concurrency.solo import TaskPool as SoloPool

    global _watchdog
    if sender is None or not issubclass(get_implementation(sender.pool_cls), SoloPool):
        return
    _watchdog = TaskWatchdog(
        app.conf.task_soft_time_limit,
        app.conf.task_time_limit,
        before_interrupt=drop_database_sockets,
    )
    _watchdog.start()


def drop_database_sockets() -> None:
    """Close every PostgreSQL connection of this thread at the libpq level, from a
    signal handler: no psycopg lock is taken (the interrupted call may hold it),
    and whatever waits on the connection next fails at once instead of blocking."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if conn.vendor == "postgresql" and conn.connection is not None:
            conn.connection.pgconn.finish()


def _in_worker(task) -> bool:
    # eager (in-process) runs share the caller's connection and transaction
    return task is not None and not getattr(task.request, "is_eager", False)


@task_prerun.connect
def _task_starts(task=None, **kwargs):
    if not _in_worker(task):
        return
    if _watchdog is not None:
        _watchdog.task_started(task.name)
    _recycle_db_connections()


@task_postrun.connect
def _task_ends(task=None, **kwargs):
    if not _in_worker(task):
        return
    if _watchdog is not None:
        # first: a soft limit raised in what follows must not leave the task
        # recorded as running (the hard limit would end an idle worker)
        _watchdog.task_finished()
    _recycle_db_connections()


def _recycle_db_connections():
    """Django's per-request connection rule, per task (see CELERY_DB_REUSE_MAX),
    with its health check (CONN_HEALTH_CHECKS: a ``SELECT 1`` round trip before
    the first query of every task, ~80 us of worker CPU and a round trip per
    message) made by looking at the socket instead (``socket_is_quiet``). A
    connection whose socket has something to say goes through Django's check."""
    from django.db import close_old_connections, connections  # set up by the time tasks run

    close_old_connections()
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and not conn.health_check_done:
            conn.health_check_done = conn.vendor == "postgresql" and socket_is_quiet(
                conn.connection
            )


def socket_is_quiet(pg) -> bool:
    """Whether an idle psycopg connection's socket has nothing to read. A server
    that ends a session — a terminated backend, a restart — first sends an error
    and closes the socket, both of which make it readable; an idle healthy
    session sends nothing (no LISTEN here). A session cut off without a word
    looks quiet: where the far end would answer a ``SELECT 1`` with a reset (an
    address moved to a new server, a NAT forgetting the flow) the task's first
    query fails instead and the chunk is retried; where nothing answers at all
    (a host gone), ``SELECT 1`` would hang too, and the libpq limits and the
    task watchdog end the wait."""
    from psycopg.pq import TransactionStatus

    if pg.closed or pg.info.transaction_status != TransactionStatus.IDLE:
        return False
    try:
        poller = select.poll()
        poller.register(pg.fileno(), select.POLLIN)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False


@celeryd_init.connect
def _local_root_is_not_a_finding(**kwargs):
    """Celery warns at every worker start when it runs as root. The warning is about
    unpickling messages as root; these workers accept JSON only (CELERY_ACCEPT_CONTENT),
    and production runs them as a non-root user (Dockerfile ``USER app``). A local run
    (DEBUG) as root — a container, a CI box — is told once in README, not at every start.
    """
    from django.conf import settings  # this module loads before Django's settings do

    if settings.DEBUG and settings.CELERY_ACCEPT_CONTENT == ["json"]:
        warnings.filterwarnings("ignore", category=SecurityWarning)
