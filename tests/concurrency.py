"""Run callables in real threads, each with its own database connection."""

import threading
from collections.abc import Callable

from django.db import OperationalError, connection, transaction


def run_in_threads(target: Callable[[int], None], count: int, timeout: float = 240) -> list:
    """Start ``count`` threads running ``target(index)`` together; return their exceptions."""
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            barrier.wait()
            target(index)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "thread did not finish"
    return errors


def commit_elsewhere(work: Callable[[], None], lock_timeout: str = "3s") -> None:
    """Run ``work()`` in a connection and transaction of its own and commit it,
    while the caller's transaction stays open; it may wait on a lock for
    ``lock_timeout`` at most (PostgreSQL), else the calling test fails."""

    def run(_):
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = '{lock_timeout}'")
            work()

    assert run_in_threads(run, 1) == []


def in_other_connection(statement, params):
    """Run one statement in a connection of its own; the error's class name or ``None``."""
    outcome = []

    def run(_):
        try:
            with connection.cursor() as cursor:
                cursor.execute(statement, params)
            outcome.append(None)
        except OperationalError as exc:
            outcome.append(type(exc.__cause__).__name__)

    assert run_in_threads(run, 1) == []
    return outcome[0]


def key_share(table, pk):
    """The lock a foreign-key check takes on the referenced row, without waiting."""
    return in_other_connection(f"SELECT 1 FROM {table} WHERE id = %s FOR KEY SHARE NOWAIT", [pk])


def share(table, pk):
    return in_other_connection(f"SELECT 1 FROM {table} WHERE id = %s FOR SHARE NOWAIT", [pk])
