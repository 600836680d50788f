"""The in-process broker (``memory://``): the embedded default, and a test double with the
semantics of the Redis Streams broker."""

from ._broker import MemoryBroker, MemoryLeaseBackend, delete_memory_queue, reset_memory_queues

__all__ = ["MemoryBroker", "MemoryLeaseBackend", "delete_memory_queue", "reset_memory_queues"]
