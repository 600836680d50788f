"""The in-process broker (``memory://``): the embedded default, and a test double with the
semantics of the Redis Streams broker. Every part is in-process (``Broker.in_process``)."""

from __future__ import annotations

from urllib.parse import urlsplit

from ._broker import MemoryBroker, MemoryLeaseBackend
from ._queue import delete_memory_queue, reset_memory_queues

__all__ = [
    "MemoryBroker",
    "MemoryLeaseBackend",
    "delete_memory_queue",
    "from_url",
    "reset_memory_queues",
]


def from_url(url: str, queue: str) -> MemoryBroker:
    """``memory://`` (queue ``queue``) or ``memory://name``."""
    return MemoryBroker(urlsplit(url).netloc or queue)
