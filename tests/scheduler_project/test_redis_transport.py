"""scheduler_project.redis_transport: a channel closed after its transport was detached.

Celery 5.7's consumer detaches the transport from its kombu ``Connection``
(``collect()``) before it closes the channel that holds the unacknowledged
messages; closing then restores them over a new pool. The process-level
test (a real worker, Redis killed with a chunk in flight) is
``tests/payments/test_engine_processes.py::
test_payment_worker_survives_a_redis_restart_with_a_chunk_in_flight``.
"""

import pytest
import redis
from kombu import Connection, Exchange, Producer, Queue

from scheduler_project.redis_transport import register

register()  # settings already did for a redis:// broker; "redis-stock" is the unpatched one


def _channel_with_an_unacked_message(url: str, scheme: str):
    conn = Connection(url.replace("redis://", f"{scheme}://", 1))
    name = "chunks"
    queue = Queue(name, Exchange(name), name)
    channel = conn.channel()
    bound = queue(channel)
    bound.declare()
    Producer(channel).publish({"chunk": 1}, exchange=queue.exchange, routing_key=name)
    message = bound.get(no_ack=False)
    assert message is not None and message.payload == {"chunk": 1}
    return conn, channel, name


def _forget_at_exit(channel) -> None:
    """A channel not closed, or whose close failed, keeps its message taken: kombu
    would restore it at interpreter exit, against a Redis the fixture has stopped."""
    channel.qos.restore_at_shutdown = False


@pytest.fixture
def broker(private_redis):
    """A Redis of the test's own: what the channels leave behind dies with it."""
    return redis.Redis.from_url(private_redis.url)


def test_detached_channel_restores_its_unacked_message(broker, private_redis):
    _conn, channel, name = _channel_with_an_unacked_message(private_redis.url, "redis")
    assert broker.llen(name) == 0  # taken, not acknowledged
    channel.connection.client = None  # what Connection.collect() leaves behind
    channel.close()
    assert broker.llen(name) == 1  # back on its queue, as on any connection loss


def test_stock_channel_fails_the_same_close(private_redis):
    """What the worker died of: not a connection error, so nothing ignored it."""
    _conn, channel, _name = _channel_with_an_unacked_message(private_redis.url, "redis-stock")
    channel.connection.client = None
    with pytest.raises(AttributeError, match="hostname"):
        channel.close()
    _forget_at_exit(channel)


def test_detached_channel_with_redis_gone_fails_as_a_connection_error(private_redis):
    """Redis unreachable: the restore fails with an error kombu and Celery ignore."""
    conn, channel, _name = _channel_with_an_unacked_message(private_redis.url, "redis")
    channel.connection.client = None
    channel._remembered_connparams = {
        key: {**params, "port": 1} for key, params in channel._remembered_connparams.items()
    }
    with pytest.raises(conn.connection_errors):
        channel.close()
    _forget_at_exit(channel)


def test_detached_channel_keeps_its_sync_and_async_parameters_apart(private_redis):
    """The consumer's pool is asynchronous, a restore's is not: each gets its own."""
    _conn, channel, _name = _channel_with_an_unacked_message(private_redis.url, "redis")
    sync, asynchronous = channel._connparams(), channel._connparams(asynchronous=True)
    assert sync["connection_class"] is not asynchronous["connection_class"]
    channel.connection.client = None
    assert channel._connparams() == sync
    assert channel._connparams(asynchronous=True) == asynchronous
    _forget_at_exit(channel)  # never closed: its message stays taken
