"""How a worker reads a partitioned queue (``_partitioned.py``): every partition, fairly.

Each fetch asks each partition for an equal share of its slots at once (the partition
asked first turns with every fetch) and gives what an emptier partition left to the others,
so a backlog in one partition never holds back the jobs of another. Only when every
partition is empty does it wait: on one Redis server in one ``XREADGROUP`` over every
partition's streams (``_wait.py``), on a cluster (a command reads one slot) on each partition
in turn for ``CLUSTER_WAIT_SLICE`` seconds. Deliveries' ids name their partition
(``<entry id>~p<N>``): entry ids repeat across streams.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ..._redis.cluster import gather_on, is_cluster
from ...job import Job
from ..base import Delivery
from ._broker import RedisBroker
from ._partitions import named
from ._wait import wait_together

#: Seconds of each partition's turn to block while every partition is empty, on a cluster.
CLUSTER_WAIT_SLICE = 0.02


class PartitionReader:
    """The fetches and reclaims of one consumer of the partitions ``parts``."""

    def __init__(self, parts: Sequence[RedisBroker], first: int) -> None:
        self.parts = parts
        self.client = parts[0].client
        self._first = first % len(parts)  # the partition asked first by the next fetch
        self._cluster = is_cluster(self.client)

    async def fetch(
        self, consumer: str, count: int, block: float, share: float = 0.0
    ) -> list[Delivery]:
        """Up to ``count`` deliveries without waiting; when every partition is empty, wait
        up to ``block`` seconds for the first. ``share``: each partition's priority share."""
        if count <= 0:
            return []
        got = await self._take(count, share)
        if got or block <= 0:
            return got
        if self._cluster:
            return await self._wait_in_turn(count, block, share)
        return await self._wait_on_all(consumer, count, block)

    async def reclaim(
        self, count: int, lease_ttl: Callable[[Job | None], float], min_idle: float
    ) -> list[Delivery]:
        out: list[Delivery] = []
        for p in self._order():
            if len(out) >= count:
                break
            out += tagged(p, await self.parts[p].reclaim(count - len(out), lease_ttl, min_idle))
        return out

    def _order(self) -> list[int]:
        """The partitions, from the one whose turn it is to be asked first."""
        first, n = self._first, len(self.parts)
        self._first = (first + 1) % n
        return [(first + k) % n for k in range(n)]

    async def _take(self, count: int, share: float) -> list[Delivery]:
        order = self._order()
        base, extra = divmod(count, len(self.parts))
        shares = [(p, base + (k < extra)) for k, p in enumerate(order) if base + (k < extra)]
        replies = await gather_on(
            self.client, *(self.parts[p].fetch(n, 0, share) for p, n in shares)
        )
        out: list[Delivery] = []
        short: set[int] = set()
        for (p, n), got in zip(shares, replies, strict=True):
            out += tagged(p, got)
            if len(got) < n:
                short.add(p)
        for p in order:  # what an emptier partition left: to the others, in turn
            if len(out) >= count:
                break
            if p not in short:
                got = await self.parts[p].fetch(count - len(out), 0, share)
                out += tagged(p, got)
                if not got:
                    short.add(p)
        return out

    async def _wait_on_all(self, consumer: str, count: int, block: float) -> list[Delivery]:
        got = await wait_together(self.parts, consumer, count, block)
        return [tagged(p, [delivery])[0] for p, delivery in got]

    async def _wait_in_turn(self, count: int, block: float, share: float) -> list[Delivery]:
        """Each partition in turn blocks for a short slice, until one delivers or ``block``
        passes."""
        deadline = time.monotonic() + block
        while True:
            for p in self._order():
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                got = await self.parts[p].fetch(count, min(CLUSTER_WAIT_SLICE, left), share)
                if got:
                    return tagged(p, got)


def tagged(partition: int, deliveries: list[Delivery]) -> list[Delivery]:
    """``deliveries`` of ``partition`` with ids naming it."""
    for delivery in deliveries:
        delivery.id = named(delivery.id, partition)
    return deliveries
