"""Time limits for tasks of a solo-pool worker (the payment workers, Procfile).

Celery enforces ``task_soft_time_limit`` and ``task_time_limit`` only in its
prefork pool, where the parent watches a child. A solo worker runs each task
itself, so without this a task blocked for good — a database host gone with
the socket still open waits for the kernel, ~2 hours — stops that worker.
Here one daemon thread watches the running task, with the same two limits:

- **soft** (``task_soft_time_limit``, 90 s): the thread signals the main thread,
  whose handler raises ``SoftTimeLimitExceeded`` inside the task, as prefork
  does. A blocked psycopg call is interrupted (its wait checks for signals).
  First the handler drops the task's database sockets (``before_interrupt``:
  the conversation was cut off mid-way, and ending a pipeline on it — as the
  exception leaves the executor's — would wait on the same dead socket
  again); the server rolls the transaction back once its backend notices
  the client gone (a statement waiting on a lock ends at the batch's
  ``statement_timeout`` at the latest), Django opens a new connection, and
  the task retries the chunk with backoff (``payments.tasks.TRANSIENT``).
- **hard** (``task_time_limit``, 120 s): if the task is still running — stuck
  where no signal handler can run — the process exits. The message was never
  acknowledged (``acks_late``): Redis delivers it again only after its
  visibility timeout, so the lease reaper re-queues the chunk's payments
  first (after their 60 s lease). The supervisor (docker-compose's
  ``restart``, systemd) starts a new worker, as prefork's pool replaces a
  killed child. Under ``scripts/dev`` honcho stops the whole local stack
  instead, which is loud rather than silent.

Either way the payments themselves are safe: the batch wrote nothing, and the
lease reaper re-queues whatever the chunk had claimed. The watching thread acts
before it logs, and logs without waiting long (``_log_briefly``). An interrupt
lands at any bytecode of the task, as Celery's prefork soft limit does.

Costs per task: two attribute writes. The thread sleeps until the running
task's next limit, and never longer than the shorter limit (a task that starts
while it sleeps reaches its own limits after it wakes): with no task running
for long, it wakes once every 90 s, not once a second. Every wake is CPU the
process is charged for whatever its load; on the benchmark's VMs a wake after a
sleep was charged 0.1-2 ms (docs/performance-history.md, session 31), so the
once-a-second tick was ~3 ms/s of each idle payment worker's CPU.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable

from celery.exceptions import SoftTimeLimitExceeded

logger = logging.getLogger(__name__)


class TaskWatchdog:
    """Watches one task at a time in this process; ``start`` from the main thread."""

    def __init__(
        self,
        soft: float | None,
        hard: float | None,
        *,
        before_interrupt: Callable[[], None] | None = None,
    ) -> None:
        # 0, None or a negative number (a mistyped setting): no such limit
        self.soft = soft if soft and soft > 0 else None
        self.hard = hard if hard and hard > 0 else None
        self.before_interrupt = before_interrupt
        self._task: tuple[int, str, float] | None = None  # (serial, name, started)
        self._serial = 0
        self._signalled: int | None = None  # serial of the task the soft limit hit
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._previous_handler = None

    def start(self) -> None:
        if self._thread is not None or not (self.soft or self.hard):
            return
        self._previous_handler = signal.signal(signal.SIGALRM, self._on_soft_limit)
        self._thread = threading.Thread(target=self._watch, name="task-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the watching thread and give SIGALRM back (tests; a worker never stops it)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        signal.signal(signal.SIGALRM, self._previous_handler)

    def task_started(self, name: str) -> None:
        self._serial += 1
        self._task = (self._serial, name, time.monotonic())

    def task_finished(self) -> None:
        self._task = None

    # --- the watching thread ------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop.wait(self.next_wait(time.monotonic())):
            self.check(time.monotonic())

    def next_wait(self, now: float) -> float:
        """How long the thread may sleep at ``now`` and still act on every limit
        when it is reached: until the running task's next limit not yet acted on,
        and at most the shorter limit — a task that starts during the sleep
        reaches its first limit no sooner than that after ``now``."""
        limits = [limit for limit in (self.soft, self.hard) if limit]
        wait = min(limits)
        task = self._task
        if task is not None:
            serial, _, started = task
            if self.soft and self._signalled != serial:
                wait = min(wait, started + self.soft - now)
            if self.hard:
                wait = min(wait, started + self.hard - now)
        return max(wait, 0.0)

    def check(self, now: float) -> None:
        """One look at the running task (the thread's loop; tests call it directly)."""
        task = self._task
        if task is None:
            return
        serial, name, started = task
        ran = now - started
        if self.hard and ran >= self.hard:
            _log_briefly(
                logging.CRITICAL,
                "task %s ran past its hard time limit (%s s); this solo worker exits",
                name,
                self.hard,
            )
            os._exit(1)
        if self.soft and ran >= self.soft and self._signalled != serial:
            self._signalled = serial
            # act first: the main thread may be stuck holding a log handler's lock
            signal.pthread_kill(threading.main_thread().ident, signal.SIGALRM)
            _log_briefly(
                logging.ERROR, "task %s ran past its soft time limit (%s s)", name, self.soft
            )

    # --- the main thread ----------------------------------------------------------------

    def _on_soft_limit(self, signum, frame) -> None:
        task = self._task
        # The task the limit hit may have finished while the signal was on its way.
        if task is not None and task[0] == self._signalled:
            if self.before_interrupt is not None:
                self.before_interrupt()
            raise SoftTimeLimitExceeded(f"soft time limit ({self.soft} s) exceeded")


def _log_briefly(level: int, message: str, *args) -> None:
    """Log from a thread of its own and wait for it at most 2 s: a handler's lock
    held by a main thread stuck writing a record (a full pipe, a stalled log
    driver) must not stop the watchdog, whose limits are for exactly that."""
    writer = threading.Thread(target=logger.log, args=(level, message, *args), daemon=True)
    writer.start()
    writer.join(2.0)
