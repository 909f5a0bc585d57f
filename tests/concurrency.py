"""Run callables in real threads, each with its own database connection."""

import threading
from collections.abc import Callable

from django.db import connection


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
