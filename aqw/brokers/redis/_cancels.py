"""Cancels pushed to the worker that runs the job: ``app.cancel`` of a running job
publishes its id on the queue's channel, ``aqw:{q}:cancels``, once ``cancel.lua`` has
marked its record; every worker on the queue listens there (one subscribed connection per
worker) and stops the handler if it runs that job. Nothing is sent or read per job.

Pub/sub is at most once: a worker whose subscription is down at that moment misses the
word, and still reads the mark with its next lease renewal (``cancel_requested``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from redis.asyncio import Redis

from ..._redis.keys import QueueKeys

log = logging.getLogger("aqw.broker")

#: Seconds between tries to subscribe again after the connection was lost.
RESUBSCRIBE = (0.1, 5.0)


def cancel_channel(keys: QueueKeys) -> str:
    """The channel the cancels of the queue's running jobs are published on."""
    return f"{keys.tag}:cancels"


async def listen_cancels(
    client: Redis,
    keys: list[QueueKeys],
    on_cancel: Callable[[str], None],
    transient: tuple[type[BaseException], ...],
) -> None:
    """Call ``on_cancel(job_id)`` for each cancel published on the queues of ``keys`` (a
    queue, or a partitioned queue's partitions: one connection), until cancelled; a lost
    connection is subscribed again (one warning until it is back)."""
    channels = [cancel_channel(k) for k in keys]
    channel = channels[0] if len(channels) == 1 else f"{channels[0]} (and partitions)"
    pause, warned = RESUBSCRIBE[0], False
    while True:
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(*channels)
            if warned:
                log.debug("listening for cancels on %s again", channel)
            pause, warned = RESUBSCRIBE[0], False
            while True:
                message = await pubsub.get_message(timeout=None)
                if message is not None and message.get("type") == "message":
                    data = message["data"]
                    on_cancel(data.decode() if isinstance(data, bytes) else str(data))
        except transient as exc:
            if not warned:  # debug: the worker says the outage once (``worker/_outage.py``)
                log.debug(
                    "listening for cancels on %s: %r; cancels reach this worker with its "
                    "lease renewals until it is back",
                    channel,
                    exc,
                )
                warned = True
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]  # typed from redis-py 8.2
        await asyncio.sleep(pause)
        pause = min(RESUBSCRIBE[1], pause * 2)
