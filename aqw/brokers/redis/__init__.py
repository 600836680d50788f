"""The Redis family (``redis://``, ``rediss://``, ``redis+cluster://``): ``RedisBroker``, a
queue on Redis Streams, and ``PartitionedBroker``, one queue over several streams."""

from ..._redis.client import MAX_BLOCK, make_client, split_queue
from ._broker import RedisBroker
from ._partitioned import PartitionedBroker
from ._partitions import check_partitions
from ._wait import can_wait_together, wait_together

__all__ = [
    "MAX_BLOCK",
    "PartitionedBroker",
    "RedisBroker",
    "can_wait_together",
    "check_partitions",
    "make_client",
    "split_queue",
    "wait_together",
]
