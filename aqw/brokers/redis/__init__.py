"""The Redis family (``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``,
``rediss+cluster://``): ``RedisBroker``, a queue on Redis Streams, and
``PartitionedBroker``, one queue over several streams. Every part is shared (Redis holds it).
"""

from __future__ import annotations

from ..._redis.client import MAX_BLOCK, make_client, split_option, split_queue
from ...errors import ConfigError
from ..base import Broker, check_partitions
from ._broker import RedisBroker
from ._partitioned import PartitionedBroker, spread
from ._wait import wait_together

__all__ = [
    "MAX_BLOCK",
    "PartitionedBroker",
    "RedisBroker",
    "from_url",
    "make_client",
    "split_queue",
    "spread",
    "wait_together",
]


def from_url(url: str, queue: str, partitions: int | None = None) -> Broker:
    """The broker of a Redis URL: ``?queue=name`` picks the queue, ``&partitions=P`` (or
    ``partitions``, which wins) spreads it over P streams (``PartitionedBroker``; 1: the
    plain layout)."""
    plain, name = split_queue(url, queue)
    plain, given = split_option(plain, "partitions")
    count = partitions if partitions is not None else _partitions_option(given)
    if check_partitions(count) > 1:
        return PartitionedBroker(plain, name, count)
    return RedisBroker(plain, name)


def _partitions_option(given: str | None) -> int:
    """A URL's ``partitions=`` value, checked (absent: 1)."""
    if given is None:
        return 1
    try:
        return check_partitions(int(given))
    except ValueError:
        raise ConfigError(f"partitions must be an integer from 1 to 1024, got {given!r}") from None
