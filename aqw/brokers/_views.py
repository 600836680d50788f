"""What the dashboard reads of a broker besides ``depth()``: the queue's depth history (one
sample per ``DEPTH_BUCKET`` seconds, written by the workers' heartbeats and kept for
``DEPTH_KEEP`` seconds, so it survives a restart on Redis) and one page of the delayed set.

``BrokerViews`` is the default every ``Broker`` has: no history and no delayed page (SQS
keeps neither where it could be read). The memory broker keeps samples in its in-process
queue (``DepthSamples``); the Redis broker in ``aqw:{q}:depth``."""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import TYPE_CHECKING, NamedTuple, Protocol

#: Seconds of one depth sample: however many workers beat, a queue gets one per bucket.
DEPTH_BUCKET = 10
#: Seconds of depth history kept (older samples are trimmed as new ones are written).
DEPTH_KEEP = 7200
#: Most samples a history holds (``DEPTH_KEEP / DEPTH_BUCKET``).
DEPTH_SAMPLES = DEPTH_KEEP // DEPTH_BUCKET


class DepthSample(NamedTuple):
    """A queue's depth at the start of one bucket (seconds since the epoch)."""

    at: float
    waiting: int
    in_flight: int
    delayed: int
    dead: int

    def encode(self) -> str:
        return f"{int(self.at)} {self.waiting} {self.in_flight} {self.delayed} {self.dead}"

    @classmethod
    def decode(cls, text: str) -> DepthSample | None:
        """The sample stored as ``text``; None when it does not parse."""
        parts = text.split()
        if len(parts) != 5:
            return None
        try:
            at, *counts = (int(p) for p in parts)
        except ValueError:
            return None
        return cls(float(at), *counts)


class DelayedJob(NamedTuple):
    """One member of the delayed set: the job's wire form and when it is due (seconds since
    the epoch, on every broker)."""

    due: float
    data: bytes


def bucket_of(at: float) -> int:
    """The start of the depth bucket holding ``at``."""
    return int(at) // DEPTH_BUCKET * DEPTH_BUCKET


class BrokerViews:
    """Depth history and delayed page of a broker that keeps neither (the default)."""

    async def sample_depth(self, at: float) -> None:
        """Record the queue's depth for the bucket of ``at`` unless that bucket has a sample
        (called with each heartbeat: one sample per bucket whatever the number of workers)."""
        return None

    async def depth_history(self, since: float) -> list[DepthSample]:
        """The depth samples taken at or after ``since``, oldest first (at most
        ``DEPTH_SAMPLES``)."""
        return []

    async def delayed_page(self, start: int, count: int) -> list[DelayedJob]:
        """Up to ``count`` delayed (and retrying) jobs, soonest due first, skipping the
        first ``start``."""
        return []


class DepthSamples:
    """Depth samples kept in one process (the memory broker's queue), bounded."""

    def __init__(self) -> None:
        self._samples: OrderedDict[int, DepthSample] = OrderedDict()

    def has(self, at: float) -> bool:
        return bucket_of(at) in self._samples

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

    def since(self, at: float) -> list[DepthSample]:
        return [s for b, s in self._samples.items() if b >= at]


class _Counts(Protocol):
    def as_dict(self) -> dict[str, int]: ...


class LocalViews(BrokerViews):
    """Depth history and delayed page of a broker holding its queue in this process: its
    ``depth_samples`` and its ``delayed_heap`` of (due, sequence, job bytes)."""

    depth_samples: DepthSamples
    delayed_heap: list[tuple[float, int, bytes]]

    if TYPE_CHECKING:

        async def depth(self) -> _Counts: ...

    async def sample_depth(self, at: float) -> None:
        if not self.depth_samples.has(at):
            counts = (await self.depth()).as_dict()
            self.depth_samples.add(DepthSample(at, *counts.values()))

    async def depth_history(self, since: float) -> list[DepthSample]:
        return self.depth_samples.since(since)

    async def delayed_page(self, start: int, count: int) -> list[DelayedJob]:
        due = heapq.nsmallest(start + count, self.delayed_heap)[start:]
        return [DelayedJob(at, data) for at, _, data in due]
