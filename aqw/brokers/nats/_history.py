"""The dashboard's depth history and delayed page of a queue on JetStream
(``KvDepthHistory``, a ``DepthHistory`` part shared by every process): one sample per
``DEPTH_BUCKET`` seconds in the bucket ``AQW_q_DEPTH``, key ``d.<bucket start>``, written
with ``create`` (the first process's sample of a bucket wins, the others' are refused by
the server), its entries dropped by the server ``DEPTH_KEEP`` seconds after they were
written (the bucket's max age: nothing to trim). The delayed page reads the delayed stream
by sequence (``get_msg``): its first ``DELAYED_SCAN`` messages, soonest due first."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Awaitable, Callable

from nats.js import JetStreamContext
from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from ..messages import DEPTH_SAMPLES, DelayedJob, DepthSample, QueueDepth, bucket_of
from ._dead import missing
from ._delayed import DUE
from ._layout import Layout
from ._state import entries

log = logging.getLogger("aqw.brokers.nats")

#: The most delayed messages one page looks at (in the stream's order).
DELAYED_SCAN = 1000


def _sample(key: str, value: bytes) -> DepthSample | None:
    """The sample of key ``d.<bucket>``, or None for a damaged one."""
    tail = key.rpartition(".")[2]
    try:
        counts = json.loads(value)
        if not tail.isdigit() or len(counts) != 4 or not all(isinstance(c, int) for c in counts):
            return None
    except (ValueError, TypeError):
        return None
    return DepthSample(float(tail), *counts)


class KvDepthHistory:
    """Depth samples in the queue's depth bucket, and the delayed page.

    Args:
        depth: the queue's depth, read when a bucket has no sample yet.
        parts: the JetStream context and the depth bucket, once connected.
        names: the queue's names.
    """

    #: Kept in NATS: every process reads the same samples.
    shared = True

    def __init__(
        self,
        depth: Callable[[], Awaitable[QueueDepth]],
        parts: Callable[[], Awaitable[tuple[JetStreamContext, KeyValue]]],
        names: Layout,
    ) -> None:
        self._depth = depth
        self._parts = parts
        self._names = names
        self._last = -1  # the last bucket known to have its sample

    async def sample(self, at: float) -> None:
        bucket = bucket_of(at)
        if bucket == self._last:
            return
        try:
            _, kv = await self._parts()
            key = f"d.{bucket}"
            with contextlib.suppress(KeyNotFoundError):
                await kv.get(key)
                self._last = bucket
                return
            counts = list((await self._depth()).as_dict().values())
            with contextlib.suppress(KeyWrongLastSequenceError):  # another process's won
                await kv.create(key, json.dumps(counts).encode())
            self._last = bucket
        except Exception as exc:  # a heartbeat must not fail for a chart
            log.warning("nats: the depth sample of queue %s failed: %r", self._names.queue, exc)

    async def since(self, at: float) -> list[DepthSample]:
        _, kv = await self._parts()
        found = (_sample(k, v) for k, v in await entries(kv, "d"))
        samples = sorted(s for s in found if s is not None and s.at >= at)
        return samples[-DEPTH_SAMPLES:]

    async def delayed_page(self, start: int, count: int) -> list[DelayedJob]:
        (js, _), names = await self._parts(), self._names
        seq, seen = 1, list[DelayedJob]()
        while len(seen) < DELAYED_SCAN:
            try:
                msg = await js.get_msg(
                    names.delayed_stream, seq, subject=names.delayed_subject, next=True
                )
            except APIError as exc:
                if not missing(exc):
                    raise
                break
            if msg.seq is None:
                break
            try:
                due = float((msg.headers or {}).get(DUE, "0"))
            except ValueError:
                due = 0.0
            seen.append(DelayedJob(due, msg.data or b""))
            seq = msg.seq + 1
        seen.sort(key=lambda d: d.due)
        return seen[start : start + count]
