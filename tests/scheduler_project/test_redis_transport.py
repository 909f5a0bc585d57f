"""scheduler_project.redis_transport: a channel closed after its transport was detached.

Celery 5.7's consumer detaches the transport from its kombu ``Connection``
(``collect()``) before it closes the channel that holds the unacknowledged
messages; closing then restores them over a new pool. The process-level
test (a real worker, Redis killed with a chunk in flight) is
``tests/payments/test_engine_processes.py::
test_payment_worker_survives_a_redis_restart_with_a_chunk_in_flight``.
"""

from time import monotonic

import pytest
import redis
from kombu import Connection, Exchange, Producer, Queue
from kombu.asynchronous import Hub

from scheduler_project.redis_transport import (
    BINDING_EXPIRY_CHECK_INTERVAL,
    BRPOP_TIMEOUT,
    register,
)

register()  # settings already did for a redis:// broker; "redis-stock" is the unpatched one


@pytest.fixture
def broker(private_redis):
    """A Redis of the test's own: what the channels leave behind dies with it."""
    return redis.Redis.from_url(private_redis.url)


@pytest.fixture
def unacked_channel(private_redis):
    """Makes a channel on the test's own Redis (``redis`` or ``redis-stock``
    transport) holding one taken, unacknowledged message.

    At teardown every channel it made is told not to restore at interpreter
    exit: one not closed, or whose close failed, still holds its message, and
    kombu would try again against a Redis the fixture has already stopped.
    """
    made = []

    def make(scheme: str):
        conn = Connection(private_redis.url.replace("redis://", f"{scheme}://", 1))
        name = "chunks"
        queue = Queue(name, Exchange(name), name)
        channel = conn.channel()
        made.append(channel)
        bound = queue(channel)
        bound.declare()
        Producer(channel).publish({"chunk": 1}, exchange=queue.exchange, routing_key=name)
        message = bound.get(no_ack=False)
        assert message is not None and message.payload == {"chunk": 1}
        return conn, channel, name

    yield make
    for channel in made:
        channel.qos.restore_at_shutdown = False


def test_detached_channel_restores_its_unacked_message(broker, unacked_channel):
    _conn, channel, name = unacked_channel("redis")
    assert broker.llen(name) == 0  # taken, not acknowledged
    channel.connection.client = None  # what Connection.collect() leaves behind
    channel.close()
    assert broker.llen(name) == 1  # back on its queue, as on any connection loss


def test_stock_channel_fails_the_same_close(unacked_channel):
    """What the worker died of: not a connection error, so nothing ignored it."""
    _conn, channel, _name = unacked_channel("redis-stock")
    channel.connection.client = None
    with pytest.raises(AttributeError, match="hostname"):
        channel.close()


def test_detached_channel_with_redis_gone_fails_as_a_connection_error(unacked_channel):
    """Redis unreachable: the restore fails with an error kombu and Celery ignore."""
    conn, channel, _name = unacked_channel("redis")
    channel.connection.client = None
    channel._remembered_connparams = {
        key: {**params, "port": 1} for key, params in channel._remembered_connparams.items()
    }
    with pytest.raises(conn.connection_errors):
        channel.close()


def test_detached_channel_keeps_its_sync_and_async_parameters_apart(unacked_channel):
    """The consumer's pool is asynchronous, a restore's is not: each gets its own."""
    _conn, channel, _name = unacked_channel("redis")
    sync, asynchronous = channel._connparams(), channel._connparams(asynchronous=True)
    assert sync["connection_class"] is not asynchronous["connection_class"]
    channel.connection.client = None
    assert channel._connparams() == sync
    assert channel._connparams(asynchronous=True) == asynchronous


def test_channel_keeps_one_client_per_pool(unacked_channel, broker):
    """kombu built a redis-py client per command; ours keeps one while its pool
    lasts, and the messages go on as before: the taken one is acknowledged."""
    _conn, channel, name = unacked_channel("redis")
    with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
        assert first is second
        assert first.connection_pool is channel.pool
    given = redis.Redis(connection_pool=channel.pool)
    with channel.conn_or_acquire(given) as passed:
        assert passed is given
    assert broker.hlen(channel.qos.unacked_key) == 1
    (tag,) = channel.qos._delivered
    channel.basic_ack(tag)
    assert broker.hlen(channel.qos.unacked_key) == 0
    assert broker.zcard(channel.qos.unacked_index_key) == 0
    assert broker.llen(name) == 0


def test_a_new_pool_gets_a_new_client(unacked_channel):
    """After a connection loss kombu drops the channel's pools; the next command
    must not go through a client bound to the dropped pool."""
    _conn, channel, _name = unacked_channel("redis")
    with channel.conn_or_acquire() as before:
        old_pool = before.connection_pool
    channel._disconnect_pools()
    with channel.conn_or_acquire() as after:
        assert after is not before
        assert after.connection_pool is channel.pool is not old_pool
        assert after.ping()


def test_an_idle_consumer_sends_brpop_with_a_long_timeout(private_redis):
    """BRPOP's timeout is how often an idle consumer wakes to send it again;
    a message still wakes it at once (the process tests run on this)."""
    conn = Connection(private_redis.url)
    try:
        assert conn.default_channel.brpop_timeout == BRPOP_TIMEOUT == 3
    finally:
        conn.release()
    conn = Connection(private_redis.url, transport_options={"polling_interval": 2})
    try:
        assert conn.default_channel.brpop_timeout == 2  # kombu's option still wins
    finally:
        conn.release()


def test_an_idle_event_loop_sleeps_until_kombus_ten_second_timers(private_redis):
    """The hub sleeps until its next timer (at most 10 s in a worker): kombu's
    binding-expiry check every second woke it every second; it now runs every
    30 s, still far inside the hour a binding table lives, and the first timer
    is kombu's 10 s ones."""
    hub = Hub()
    conn = Connection(private_redis.url)
    try:
        conn.default_channel  # noqa: B018 - the channel the cycle polls
        conn.transport.register_with_event_loop(conn.connection, hub)
        registered = monotonic()
        conn.transport.register_with_event_loop(conn.connection, hub)  # as on a reconnect
        live = [(eta, entry) for eta, _priority, entry in hub.timer.queue if not entry.canceled]
        names = [entry.fun.__wrapped__.__name__ for _eta, entry in live]
        assert names.count("maybe_refresh_binding_expiry") == 1  # the old one cancelled
        due = {entry.fun.__wrapped__.__name__: eta - registered for eta, entry in live}
        assert due["maybe_refresh_binding_expiry"] >= BINDING_EXPIRY_CHECK_INTERVAL
        assert min(due.values()) >= 10  # kombu's restore and re-auth checks
    finally:
        hub.close()
        conn.release()


def test_both_redis_schemes_take_this_transport():
    """``rediss://`` (TLS) brokers get the same channel as ``redis://``."""
    from kombu.transport import resolve_transport

    from scheduler_project.redis_transport import Transport

    assert resolve_transport("redis") is Transport
    assert resolve_transport("rediss") is Transport
    assert resolve_transport("redis-stock") is not Transport


def test_an_attached_channel_builds_from_its_connection_of_now(unacked_channel):
    """The remembered parameters stand in only while the transport is detached;
    attached, a channel reads its connection as it is (kombu's failover moves it)."""
    _conn, channel, _name = unacked_channel("redis")
    before = channel._connparams()
    channel.connection.client.port = before["port"] + 1
    assert channel._connparams()["port"] == before["port"] + 1
