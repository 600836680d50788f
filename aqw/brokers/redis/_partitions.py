"""Where a job of a partitioned queue lives (``_partitioned.py``), and how its id says so.

A job with a *route* (a string naming what must stay together: its task when the task has a
task-wide rate limit, else its per-key cap's key, its rate key, its idempotency or debounce
key, its message group) goes to the partition the route hashes to, so every job of one key
meets the same idempotency records, completion records, debounce record and per-key limits.
A job without one goes to the next partition in turn.

The partition is written into the job's id (``<id>~p<N>``) and into the ids of its DLQ
entries, so a lookup by id (status, result, cancel, replay) reads one partition, not all.
"""

from __future__ import annotations

import os
import zlib

#: Between an id and the partition it names.
MARK = "~p"


def partition_of_route(route: str, partitions: int) -> int:
    """The partition ``route`` hashes to (CRC-32: the same in every process)."""
    return zlib.crc32(route.encode()) % partitions


def named(name: str, partition: int) -> str:
    """``name`` (a job id, a DLQ entry id) marked as partition ``partition``'s."""
    return f"{name}{MARK}{partition}"


def split_name(name: str, partitions: int) -> tuple[str, int | None]:
    """(``name`` without its partition mark, the partition it names), or (``name``, None)
    when it carries no valid mark."""
    base, mark, number = name.rpartition(MARK)
    if not mark or not number.isdigit() or len(number) > 4:
        return name, None
    partition = int(number)
    return (base, partition) if partition < partitions else (name, None)


class Turns:
    """The next partition for a job without a route: each in turn, from a random one (many
    producers that each enqueue a few jobs do not all start at partition 0)."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self._next = int.from_bytes(os.urandom(2), "big") % partitions

    def take(self) -> int:
        partition = self._next
        self._next = (partition + 1) % self.partitions
        return partition
