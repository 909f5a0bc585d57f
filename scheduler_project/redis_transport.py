"""kombu's Redis transport, made to survive a broker restart under a busy worker.

Celery 5.7's consumer, on losing the broker (Redis restarted, network cut),
first ``collect()``s the connection — which detaches the transport from its
kombu ``Connection`` (``transport.client = None``) — and then ``close()``s it.
Closing the consumer's channel drops its Redis connection pools and then
restores the messages it had taken but not yet acknowledged (``acks_late``: a
chunk being executed at that moment); restoring needs a new pool, the pool's
parameters are read from ``transport.client``, and that is ``None``:

    AttributeError: 'NoneType' object has no attribute 'hostname'

It is not a connection error, so nothing on the way ignores it, and the whole
worker exits (``Unrecoverable error``). A worker busy when Redis restarts —
every payment worker under load — died that way in 21 of 24 broker losses of
a 2-minute chaos run (``bench/chaos.py --faults redis_restart``); only a
process supervisor brought it back, and payments waited for it. This is
celery/kombu#582 come back through a new code path.

``Channel`` here remembers the connection parameters it was created with, so
a channel whose transport was detached still builds its pool from them:
restoring then behaves as on any other connection loss — the unacknowledged
messages go back on their queue if Redis answers, or the attempt fails with a
``redis.ConnectionError`` that kombu and Celery ignore, and the consumer
reconnects. Nothing here decides whether a payment runs: a re-delivered chunk
is fenced in the database like any duplicate message (DESIGN §4.1), and a lost
one is re-queued by the lease reaper.

The channel also keeps the redis-py client it builds for as long as its pool
lasts (``Channel.conn_or_acquire``): kombu built one for every command it
sent without one, two for every message a worker takes.

An idle consumer wakes less (``Transport``): BRPOP is sent with a 3 s
server-side timeout instead of 1 s, and the binding-expiry check that kombu
runs every second runs every 30 s. Each wake of an idle process costs CPU
(on the benchmark's VMs the kernel charges a wake ~0.3-2 ms), and a payment
worker between messages is idle.

``register()`` (settings call it for ``redis://`` and ``rediss://`` broker
URLs) points those schemes at this transport in every process.
``tests/payments/test_engine_processes.py`` kills and restarts a Redis
under a real worker with a chunk in flight;
``tests/scheduler_project/test_redis_transport.py`` tests the channel.
"""

from __future__ import annotations

from contextlib import contextmanager

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    """A Redis channel that can still build a pool after its transport was detached,
    and that builds one client per pool instead of one per command."""

    def _connparams(self, asynchronous: bool = False) -> dict:
        remembered = self.__dict__.setdefault("_remembered_connparams", {})
        if self.connection.client is None and asynchronous in remembered:
            return dict(remembered[asynchronous])
        params = super()._connparams(asynchronous=asynchronous)
        remembered[asynchronous] = dict(params)
        return params

    @contextmanager
    def conn_or_acquire(self, client=None):
        """kombu's, with the client kept while the channel's pool lasts.

        kombu builds a new redis-py client for every call without one: the
        unacknowledged index's append and the ack of every message a worker
        takes, every publish. Building one copies redis-py's table of reply
        callbacks, 116 µs on session 24's host — two per consumed message, ~7 %
        of a payment worker's main process per message
        (docs/performance-history.md, session 24). A client holds no
        connection of its own (each command takes one from the pool and gives
        it back), so one per pool serves every caller; a pool dropped on a
        connection loss (``_disconnect_pools``) gets a new client with the new
        pool.
        """
        if client:
            yield client
            return
        pool = self.pool
        kept = self.__dict__.get("_kept_client")
        if kept is None or kept.connection_pool is not pool:
            kept = self.__dict__["_kept_client"] = self._create_client()
        yield kept


#: BRPOP's server-side timeout (kombu's is 1 s). A message wakes an idle
#: consumer when it arrives whatever the timeout; the timeout sets how often an
#: idle consumer re-sends BRPOP, and what else waits on the BRPOP in flight:
#: - closing the channel reads that BRPOP's reply first (kombu's
#:   ``Channel.close``), so a warm shutdown takes up to this long more: 3 s
#:   stays under Celery's 5 s socket timeout at a cold shutdown (past it the
#:   unacknowledged messages are not restored) and docker's 10 s grace;
#: - a solo worker running a task leaves its BRPOP open, so a message arriving
#:   in the task's first seconds is taken and waits for the task to end (a
#:   batch takes milliseconds; a message lost with a killed worker is re-queued
#:   by the lease reaper either way);
#: - a consumer on a half-open connection notices within about
#:   ``BRPOP_TIMEOUT + 2 * health_check_interval`` (kombu's check, 25 s): 53 s
#:   instead of 51, while the other workers keep consuming every queue.
#: The transport option ``polling_interval`` still overrides it, as in kombu.
BRPOP_TIMEOUT = 3

#: How often the event loop checks kombu's binding tables for expiring queues
#: (kombu: every second). A table lives at least an hour
#: (``kombu.transport.redis.MIN_BINDING_TTL``) and is refreshed at a third of
#: that; the sweep of overdue tables runs every ``BINDING_SWEEP_INTERVAL``
#: (60 s): checking every 30 s keeps both well inside their time.
BINDING_EXPIRY_CHECK_INTERVAL = 30.0


class Transport(kombu_redis.Transport):
    """``redis://`` whose channels survive the consumer's close after a broker
    loss, and whose idle consumer wakes less often."""

    Channel = Channel
    brpop_timeout = BRPOP_TIMEOUT

    def register_with_event_loop(self, connection, loop):
        """kombu's, with the binding-expiry check every
        ``BINDING_EXPIRY_CHECK_INTERVAL`` seconds instead of every second: the
        event loop sleeps until its next timer, and this one was the only timer
        under 10 s."""
        super().register_with_event_loop(connection, loop)
        cycle = self.cycle
        cycle._binding_expiry_tref.cancel()
        cycle._binding_expiry_tref = loop.call_repeatedly(
            BINDING_EXPIRY_CHECK_INTERVAL, cycle.maybe_refresh_binding_expiry
        )


def register() -> None:
    """Make ``redis://`` and ``rediss://`` URLs use this transport in every process."""
    TRANSPORT_ALIASES["redis"] = f"{__name__}:Transport"
    TRANSPORT_ALIASES["rediss"] = f"{__name__}:Transport"
    TRANSPORT_ALIASES["redis-stock"] = "kombu.transport.redis:Transport"
