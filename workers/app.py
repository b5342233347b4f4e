"""Celery entry point for ``celery -A workers.app worker|beat``: the base app, no transports."""

import sys

import redis
from kombu.transport import redis as kombu_redis

from relay.config import ConfigError
from relay.context import create_base_app


def guard_detached_redis_channels() -> None:
    """Make a kombu Redis channel whose connection is gone raise ``redis.ConnectionError``.

    Without this a Redis outage kills the worker about one time in two (the Redis drill,
    ``tests/test_drills.py``). When the broker goes away, Celery's consumer calls
    ``connection.collect()`` and then ``connection.close()``. If a BRPOP was pending on
    the dead socket, the task channel's close in ``collect()`` stops early, because
    ``Channel.close`` first reads that reply and the read raises. The transport's
    ``close_connection`` then stops at the first other channel (pidbox, gossip) whose
    close fails, and ``collect()`` detaches the transport (``transport.client = None``).
    So the task channel is closed again only after the detach. Its ``restore_unacked``,
    like the ``acks_late`` ack of a task that finishes after the loss, builds a redis
    pool from ``self.connection.client``, which is None by then:
    ``AttributeError: 'NoneType' object has no attribute 'hostname'`` (kombu 5.7.0, the
    newest release available). An AttributeError is not one of the transport's
    connection errors, so it gets past Celery's reconnect handling ("Unrecoverable
    error") and the worker exits. No setting fixes this close path: acks_late, the
    retry settings and the pool type leave it as it is. Turning off gossip, mingle and
    remote control would leave a single channel and miss the ordering only by luck, and
    would lose ``celery inspect``/``control``.

    Raised as the connection error it really is, it goes where every other broker error
    goes: ``ignore_errors`` drops it during the close, ``Message.ack_log_error`` logs
    "Couldn't ack", and the consumer reconnects when Redis is back. The message stays in
    Redis's unacked index and is delivered again after the visibility timeout (at least
    once; the outbox sweep covers the webhooks meanwhile). Idempotent. It is not needed
    once kombu raises a connection error there itself.
    """
    channel_cls = kombu_redis.Channel
    original = channel_cls._connparams
    if getattr(original, "_relay_detached_guard", False):
        return

    def _connparams(self, *args, **kwargs):
        transport = self.connection
        if transport is None or transport.client is None:
            raise redis.exceptions.ConnectionError("the broker connection of this channel was closed")
        return original(self, *args, **kwargs)

    _connparams._relay_detached_guard = True
    _connparams.__wrapped__ = original
    channel_cls._connparams = _connparams


guard_detached_redis_channels()

try:
    flask_app = create_base_app()
except ConfigError as exc:
    sys.stderr.write(f"relay: configuration error: {exc}\n")
    raise SystemExit(3) from None
celery_app = flask_app.extensions["celery"]
