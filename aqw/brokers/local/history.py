"""The depth history and the delayed page of a queue held in this process
(``LocalDepthHistory``, a ``DepthHistory`` part that is not shared): one sample per
``DEPTH_BUCKET`` seconds, bounded, and one page of the queue's heap of delayed jobs. The
memory broker keeps one per queue; the Redis broker keeps its samples in ``aqw:{q}:depth``."""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from ..messages import (
    DEPTH_KEEP,
    DEPTH_SAMPLES,
    DelayedJob,
    DepthSample,
    QueueDepth,
    bucket_of,
)


class LocalDepthHistory:
    """Depth samples of one in-process queue, and its delayed page.

    Args:
        depth: the queue's depth, read when a bucket has no sample yet.
        delayed: the queue's heap of (due, sequence, job bytes).
    """

    __slots__ = ("_delayed", "_depth", "_samples")

    #: Kept in this process only.
    shared = False

    def __init__(
        self,
        depth: Callable[[], Awaitable[QueueDepth]],
        delayed: list[tuple[float, int, bytes]],
    ) -> None:
        self._depth = depth
        self._delayed = delayed
        self._samples: OrderedDict[int, DepthSample] = OrderedDict()

    async def sample(self, at: float) -> None:
        if bucket_of(at) not in self._samples:
            counts = (await self._depth()).as_dict()
            self.add(DepthSample(at, *counts.values()))

    def add(self, sample: DepthSample) -> None:
        """Keep ``sample`` for its bucket unless the bucket has one; drop expired ones."""
        bucket = bucket_of(sample.at)
        if bucket in self._samples:
            return
        self._samples[bucket] = sample._replace(at=float(bucket))
        while self._samples and next(iter(self._samples)) < bucket - DEPTH_KEEP:
            self._samples.popitem(last=False)
        while len(self._samples) > DEPTH_SAMPLES:
            self._samples.popitem(last=False)

    async def since(self, at: float) -> list[DepthSample]:
        return [s for b, s in self._samples.items() if b >= at]

    async def delayed_page(self, start: int, count: int) -> list[DelayedJob]:
        due = heapq.nsmallest(start + count, self._delayed)[start:]
        return [DelayedJob(at, data) for at, _, data in due]
