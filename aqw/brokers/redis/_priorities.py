"""Priority levels of a queue on Redis: one stream and one delayed set per level, all in the
queue's slot. Level 0 is the queue's plain ``aqw:{q}:stream`` and ``aqw:{q}:delayed``, so a
queue that never uses priorities keeps its layout and its costs; a level N > 0 has
``aqw:{q}:stream:pN`` and ``aqw:{q}:delayed:pN`` (``QueueKeys.stream_for/delayed_for``).

Producers announce a level when they first use it, and again every ``ANNOUNCE_EVERY``
seconds: its stream's consumer group is created and the level is added to the set
``aqw:{q}:levels``. Workers re-read that set about once a second (``REFRESH_EVERY``), so no
one scans keys. A fetch reads the levels highest first without blocking, all in one script
(``fetch_levels.lua``), and only when every level is empty blocks on all their streams at
once. A delivery remembers the level it was read from (``Delivery.level``), so the steps
that settle it act on its own stream (``locate``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

from ..._readback import to_int
from ..._redis import scripts
from ..._redis.batch import CommandBatcher
from ..._redis.client import CLIENT_ERRORS
from ..._redis.keys import GROUP, QueueKeys
from ...job import MAX_PRIORITY, Job
from ..base import Delivery, QueueDepth
from ._entries import decode_job, delivery_of, text

T = TypeVar("T")

#: Seconds after which a producer announces a level it uses again (its group and its
#: member of the levels set are recreated should the data have been lost meanwhile).
ANNOUNCE_EVERY = 30.0
#: Seconds between a worker's reads of the levels set.
REFRESH_EVERY = 1.0
#: The longest an idle worker blocks while levels hold fair jobs, in ms: a fair job waits in
#: its key's turn, not in a stream, so its enqueue wakes no blocked read.
FAIR_BLOCK_MS = 100
#: One reclaim looks at up to ``max(RECLAIM_SCAN_MIN, count * RECLAIM_SCAN_FACTOR)`` idle
#: pending entries of a level.
RECLAIM_SCAN_MIN = 16
RECLAIM_SCAN_FACTOR = 4


def locate(keys: QueueKeys, delivery: Delivery) -> tuple[str, str]:
    """(the stream, the entry id) of a delivery of this queue: its level's stream."""
    return keys.stream_for(delivery.level), delivery.id


def _is(exc: BaseException, code: str) -> bool:
    """True for a Redis error reply starting with ``code`` (BUSYGROUP, NOGROUP, ...)."""
    return isinstance(exc, CLIENT_ERRORS) and str(exc).startswith(code)


class RedisLevels:
    """The priority levels of one queue (``RedisBroker.levels``)."""

    def __init__(self, batcher: CommandBatcher, keys: QueueKeys) -> None:
        self.batcher = batcher
        self.client = batcher.client
        self.keys = keys
        #: The levels a worker reads, highest first (0 is always one).
        self.active: tuple[int, ...] = (0,)
        self._read_at = -math.inf
        self._announced: dict[int, float] = {}
        self._fetch = scripts.load("fetch_levels")
        #: The levels that hold fair jobs (members ``f<level>`` of the levels set): fetched
        #: by ``fair_fetch.lua``, which picks across their keys (``_fair.py``).
        self.fair: frozenset[int] = frozenset()
        self._fair_fetch = scripts.load("fair_fetch")
        self._promote = scripts.load("promote")
        self._reclaim = scripts.load("reclaim")
        self._reclaim_from: dict[int, str] = {}

    # -- producing -------------------------------------------------------------------------

    async def around(self, jobs: Sequence[Job], step: Awaitable[T]) -> T:
        """Run ``step`` (a publish of ``jobs``), announcing the levels of ``jobs`` that this
        process has not announced lately in the same round trip."""
        now = time.monotonic()
        due = {
            j.priority
            for j in jobs
            if j.priority and now - self._announced.get(j.priority, -math.inf) > ANNOUNCE_EVERY
        }
        if not due:
            return await step
        _, out = await asyncio.gather(self.announce(due, now), step)
        return out

    async def announce(self, levels: Iterable[int], now: float | None = None) -> None:
        """Create the consumer groups of ``levels`` and add them to the levels set."""
        levels = sorted(levels)
        if not levels:
            return
        calls = []
        for level in levels:
            stream = self.keys.stream_for(level)
            calls.append(self.batcher.execute("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM"))
        calls.append(self.batcher.execute("SADD", self.keys.levels, *levels))
        for reply in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(reply, BaseException) and not _is(reply, "BUSYGROUP"):
                raise reply
        for level in levels:
            self._announced[level] = time.monotonic() if now is None else now
        self.active = tuple(sorted({*self.active, *levels}, reverse=True))  # known here now

    # -- the levels in use -----------------------------------------------------------------

    async def refresh(self) -> None:
        """Re-read the levels set when it was last read ``REFRESH_EVERY`` seconds ago (each
        fetch reads it too, in the same step)."""
        now = time.monotonic()
        if now - self._read_at < REFRESH_EVERY:
            return
        try:
            members: Any = await self.batcher.execute("SMEMBERS", self.keys.levels)
        except CLIENT_ERRORS as exc:
            if not _is(exc, "WRONGTYPE"):
                raise
            members = []  # not a set aqw wrote: level 0 only
        self.saw(members)

    def saw(self, members: Any) -> None:
        """The levels set's members as just read: the levels read from now on."""
        self._read_at = time.monotonic()
        found = {to_int(m, 0) for m in members}
        self.active = tuple(sorted({0, *(n for n in found if 0 < n <= MAX_PRIORITY)}, reverse=True))
        self.fair = fair_levels(members)

    async def ensure_groups(self) -> None:
        """Create the consumer group of every active level (a stream deleted under us)."""
        await self.announce([lv for lv in self.active if lv])
        try:
            await self.batcher.execute("XGROUP", "CREATE", self.keys.stream, GROUP, "0", "MKSTREAM")
        except CLIENT_ERRORS as exc:
            if not _is(exc, "BUSYGROUP"):
                raise

    # -- consuming -------------------------------------------------------------------------

    async def fetch(self, consumer: str, count: int, block_ms: int, share: bool) -> list[Delivery]:
        """Up to ``count`` new deliveries from the active levels, highest first (from the
        lowest waiting one first when ``share``), blocking on all of them when none waits
        (up to ``block_ms``; 0: not at all).
        The levels set is read in the same step: a level new to this worker is read from its
        next fetch on."""
        levels, fair = self.active, self.fair
        streams = [self.keys.stream_for(lv) for lv in levels]
        try:
            # On the client, as the blocking read below: not through the batcher, where the
            # settle steps of running jobs would queue behind a fetch.
            if fair:  # some levels hold fair jobs: picked in the same step (``_fair.py``)
                head = [GROUP, consumer, count, "1" if share else "0", self.keys.tag + ":"]
                reply: Any = await self._fair_fetch(
                    self.client, [self.keys.levels, *streams], [*head, *levels]
                )
                block_ms = min(block_ms, FAIR_BLOCK_MS)
            else:
                reply = await self._fetch(
                    self.client,
                    [self.keys.levels, *streams],
                    [GROUP, consumer, count, "1" if share else "0", *(lv for lv in levels if lv)],
                )
            self.saw(reply[0])
            out = [
                delivery_of_level(reply[i + 1], reply[i + 2], levels[int(reply[i]) - 2])
                for i in range(1, len(reply), 3)
            ]
            if out:
                return held_by(out, consumer)
            if self.active != levels or self.fair != fair:  # new here: read it now
                return await self.fetch(consumer, count, block_ms, share)
            if block_ms <= 0:  # asked not to wait
                return out
            blocked: Any = await self.client.xreadgroup(
                GROUP, consumer, dict.fromkeys(streams, ">"), count=count, block=block_ms
            )
        except CLIENT_ERRORS as exc:
            if not _is(exc, "NOGROUP"):
                raise
            await self.ensure_groups()  # a stream was deleted under us: recreate, read again
            return []
        if not blocked:
            return out
        level_of = dict(zip(streams, levels, strict=True))
        for stream, entries in sorted(blocked or [], key=lambda r: -level_of[text(r[0])]):
            for entry_id, fields in entries:
                if fields:
                    out.append(delivery_of(entry_id, fields))
                    out[-1].level = level_of[text(stream)]
        return held_by(out, consumer)

    async def promote(self, now_ms: int, most: int) -> tuple[int, int]:
        """Move due jobs of every active level's delayed set to its stream: (the most moved
        from one level, the due time in ms of the next job of any level, or -1)."""
        calls = [
            self.batcher.script(
                self._promote,
                [self.keys.delayed_for(lv), self.keys.stream_for(lv)],
                [now_ms, most],
            )
            for lv in self.active
        ]
        replies = await asyncio.gather(*calls)
        moved = max(int(m) for m, _ in replies)
        due = [int(n) for _, n in replies if int(n) >= 0]
        return moved, min(due) if due else -1

    async def depth(self) -> QueueDepth:
        """Waiting, in flight, delayed and dead, summed over the levels of the levels set."""
        pipe = self.client.pipeline(transaction=False)
        pipe.smembers(self.keys.levels)
        pipe.xlen(self.keys.dlq)
        _level_counts(pipe, self.keys, 0)
        first: Any = await pipe.execute(raise_on_error=False)
        members, dead = first[0], _counted(first[1])
        levels = [] if isinstance(members, Exception) else [to_int(m, 0) for m in members]
        counts = list(first[2:])
        levels = sorted({n for n in levels if 0 < n <= MAX_PRIORITY})
        if levels:
            pipe = self.client.pipeline(transaction=False)
            for level in levels:
                _level_counts(pipe, self.keys, level)
            counts += await pipe.execute(raise_on_error=False)
        fair = fair_levels([] if isinstance(members, Exception) else members)
        waiting = in_flight = delayed = 0
        for lv in sorted(fair):  # the jobs waiting in the fair keys' turns
            waiting += to_int(await self.client.get(f"{self.keys.tag}:fair{_sfx(lv)}:n"), 0)
        for i in range(0, len(counts), 3):
            length, later, pending = counts[i : i + 3]
            busy = 0 if isinstance(pending, Exception) else int(pending["pending"])
            waiting += max(0, _counted(length) - busy)
            in_flight += busy
            delayed += _counted(later)
        return QueueDepth(waiting, in_flight, delayed, dead)

    # -- crash recovery --------------------------------------------------------------------

    async def reclaim(
        self,
        consumer: str,
        count: int,
        lease_ttl: Callable[[Job | None], float],
        min_idle: float,
    ) -> list[Delivery]:
        """``Broker.reclaim`` over the active levels, highest first."""
        out: list[Delivery] = []
        for level in self.active:
            if len(out) >= count:
                break
            out += await self._reclaim_level(level, consumer, count - len(out), lease_ttl, min_idle)
        return out

    async def _reclaim_level(
        self,
        level: int,
        consumer: str,
        count: int,
        lease_ttl: Callable[[Job | None], float],
        min_idle: float,
    ) -> list[Delivery]:
        stream = self.keys.stream_for(level)
        limit = max(RECLAIM_SCAN_MIN, count * RECLAIM_SCAN_FACTOR)
        try:
            pending: Any = await self.client.xpending_range(
                stream,
                GROUP,
                self._reclaim_from.get(level, "-"),
                "+",
                limit,
                idle=max(0, int(min_idle * 1000)),
            )
        except CLIENT_ERRORS as exc:
            if not _is(exc, "NOGROUP"):
                raise
            await self.ensure_groups()
            return []
        # A full page: scan on from its end next time, so entries past the first ``limit``
        # idle ones (waiting for a longer TTL) cannot hide due ones forever.
        full = len(pending) >= limit
        self._reclaim_from[level] = f"({text(pending[-1]['message_id'])}" if full else "-"
        candidates = [(text(p["message_id"]), int(p["time_since_delivered"])) for p in pending]
        if not candidates:
            return []
        pipe = self.client.pipeline(transaction=False)
        for entry_id, _ in candidates:
            pipe.xrange(stream, entry_id, entry_id)
        ranges: list[Any] = await pipe.execute()
        due = self._due_for_reclaim(candidates, ranges, lease_ttl, count)
        if len(due) >= count:
            self._reclaim_from[level] = "-"  # due entries may be left over in this page
        if not due:
            return []
        keys: list[str] = [stream]
        records: list[str] = []
        argv: list[Any] = [GROUP, consumer]
        for entry_id, own_ms, lease_key, _, job_id in due:
            keys.append(lease_key or self.keys.lease("-"))
            records.append(self.keys.record(job_id if job_id is not None else "-"))
            argv += [entry_id, own_ms, 1 if lease_key else 0]
        claimed: Any = await self.batcher.script(self._reclaim, keys + records, argv)
        fields_of = {entry_id: fields for entry_id, _, _, fields, _ in due}
        out = []
        for entry_id, delivered in claimed:
            fields = fields_of.get(text(entry_id))
            if fields is not None:  # None: deleted from the stream, now dropped from the PEL
                out.append(delivery_of(entry_id, fields, int(delivered)))
                out[-1].level = level
        return out

    def _due_for_reclaim(
        self,
        candidates: list[tuple[str, int]],
        ranges: list[Any],
        lease_ttl: Callable[[Job | None], float],
        count: int,
    ) -> list[tuple[str, int, str | None, dict[Any, Any] | None, str | None]]:
        """The candidates idle for at least their own job's lease TTL, at most ``count`` of
        them: (entry id, that TTL in ms, the job's lease key or None, the entry's fields or
        None when it is no longer in the stream, the job's id or None)."""
        due: list[tuple[str, int, str | None, dict[Any, Any] | None, str | None]] = []
        for (entry_id, idle_ms), entries in zip(candidates, ranges, strict=True):
            fields: dict[Any, Any] | None = entries[0][1] if entries else None
            job = decode_job(fields)
            own_ms = max(0, math.ceil(lease_ttl(job) * 1000))
            if idle_ms < own_ms:
                continue
            lease = self.keys.lease(job.id) if job else None
            due.append((entry_id, own_ms, lease, fields, job.id if job else None))
            if len(due) >= count:
                break
        return due


def _sfx(level: int) -> str:
    return f":p{level}" if level else ""


def fair_levels(members: Any) -> frozenset[int]:
    """The levels the levels set's ``members`` mark as holding fair jobs (``f<level>``)."""
    out = set()
    for member in members:
        name = text(member)
        if len(name) == 2 and name[0] == "f" and name[1].isdigit():
            out.add(int(name[1]))
    return frozenset(out)


def held_by(deliveries: list[Delivery], consumer: str) -> list[Delivery]:
    """Mark ``deliveries`` as read by ``consumer``: two workers may share a broker, each
    reading as its own consumer, and a settle acts as the one that read the delivery."""
    for delivery in deliveries:
        delivery.receipt = consumer
    return deliveries


def delivery_of_level(entry_id: Any, flat: list[Any], level: int) -> Delivery:
    """A delivery from ``fetch_levels.lua``'s reply: the entry's fields come as a flat list."""
    if len(flat) == 2 and flat[0] == b"j":  # an entry aqw wrote: its one field, the job
        return Delivery(id=text(entry_id), data=flat[1], level=level)
    d = delivery_of(entry_id, dict(zip(flat[::2], flat[1::2], strict=True)))
    d.level = level
    return d


def _level_counts(pipe: Any, keys: QueueKeys, level: int) -> None:
    pipe.xlen(keys.stream_for(level))
    pipe.zcard(keys.delayed_for(level))
    pipe.xpending(keys.stream_for(level), GROUP)


def _counted(reply: Any) -> int:
    if isinstance(reply, Exception):
        raise reply
    return int(reply)
