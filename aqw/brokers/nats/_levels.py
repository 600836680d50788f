"""Priority levels of a queue on JetStream: level 0 is the queue's plain subject and its
consumer ``aqw``, so a queue that never uses priorities keeps its layout and its costs; a
level N > 0 is subject ``aqw.q.jobs.pN`` in the same stream (its sequence numbers are the
queue's, so a delivery's id names it whatever its level) with its own durable consumer
``aqw-pN`` (``Layout.subject_for/consumer_for``).

A producer announces a level when it first uses it: it creates the level's consumer, then
puts the key ``levels.N`` in the queue's state bucket. Every connected broker watches
``levels.*`` (read to the end at connect, then pushed by the server), so a worker learns of
a new level as soon as it is announced, without a scan and without a round trip per fetch:
a queue that never uses levels pays one subscription per connection, nothing per job.

A fetch reads the stream's message count per subject (one round trip), then the levels
that hold messages highest first, each with a pull the server answers at once with what the
level holds (``NoWaitPull``: a short timed pull came back empty from a level that held jobs
when the machine was busy, and the pass went on to a lower level), and when every
level is empty waits on the highest level in slices of ``SLICE`` seconds,
re-reading the others between slices: a job of a lower level waits at most one slice when
the queue is idle. The priority share starts about that fraction of the fetches from the
lowest level with jobs waiting (``ShareCredit``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue

from ..._cancel import stop_task
from ..local.priorities import ShareCredit
from ..messages import Delivery
from ._layout import Layout, ensure_consumer
from ._pull import NoWaitPull
from ._window import Windows, pull

#: Seconds the watch of the levels may take to list those announced before.
LIST_TIMEOUT = 5.0
#: The longest a fetch waits on the highest level before it looks at the others again.
SLICE = 0.1
#: The longest a look at one level waits for the server's answer (it answers at once).
PEEK_ANSWER = 2.0
#: Seconds a look waits for what a level's pull subscription has buffered already.
PEEK = 0.01
#: The longest one pull request of a plain queue's fetch waits: a longer block is several
#: pulls. A pull request lost with its server (killed, restarted) is waited out to its end
#: by nats-py, so this bounds how long a worker sits on a dead request after a reconnect.
PULL_SLICE = 0.25

#: The AckWait a producer gives a level's consumer it creates (the workers raise it to
#: their lease window when they find the level).
PRODUCER_ACK_WAIT = 30.0


def _level_of(key: str) -> int | None:
    """The level of key ``levels.N`` (None for a damaged one)."""
    tail = key.rpartition(".")[2]
    return int(tail) if tail.isdigit() and 0 < int(tail) <= 9 else None


class NatsLevels:
    """The priority levels of one queue (``NatsBroker.levels``): their consumers and the
    fetch across them."""

    def __init__(
        self,
        nc: Client,
        js: JetStreamContext,
        kv: KeyValue,
        names: Layout,
        windows: Windows,
        max_deliver: int,
    ) -> None:
        self._nc = nc
        self._js = js
        self._kv = kv
        self._names = names
        self._windows = windows
        self._max_deliver = max_deliver
        #: The levels above 0 known here, highest first, with their pull subscriptions.
        self._subs: dict[int, JetStreamContext.PullSubscription] = {}
        #: The no-wait looks at each level, level 0 too.
        self._peeks: dict[int, NoWaitPull] = {0: NoWaitPull(nc, names.stream, names.consumer)}
        self.active: tuple[int, ...] = ()
        self._announced: set[int] = set()
        #: The levels the watch has seen announced.
        self._found: set[int] = set()
        self._watcher: KeyValue.KeyWatcher | None = None
        self._task: asyncio.Task[None] | None = None
        self._credit = ShareCredit()
        #: Whether this process fixes the AckWait (the URL's ``ack_wait=``).
        self.exact = False

    # -- producing -------------------------------------------------------------------------

    async def announce(self, levels: Iterable[int]) -> None:
        """The levels of ``levels`` (above 0) this process has not announced: their
        consumers made when missing (one that exists keeps its AckWait), then their keys."""
        for level in sorted(set(levels) - self._announced - {0}):
            names = self._names
            try:
                await self._js.consumer_info(names.stream, names.consumer_for(level))
            except NotFoundError:
                await ensure_consumer(
                    self._js,
                    names.stream,
                    names.consumer_for(level),
                    names.subject_for(level),
                    max(PRODUCER_ACK_WAIT, self._windows.ack_wait),
                    False,
                    self._max_deliver,
                )
            await self._kv.put(f"levels.{level}", b"1")
            self._announced.add(level)

    # -- the levels in use -----------------------------------------------------------------

    async def start(self) -> None:
        """The watch of the announced levels: those announced before read to the end, then
        the later ones taken as the server pushes them."""
        self._watcher = watcher = await self._kv.watch("levels.*", ignore_deletes=True)
        while True:
            entry = await watcher.updates(timeout=LIST_TIMEOUT)  # type: ignore[no-untyped-call]
            if entry is None:
                break
            self._take(entry.key)
        self._task = asyncio.create_task(self._follow(watcher))

    def _take(self, key: str) -> None:
        level = _level_of(key)
        if level is not None:
            self._found.add(level)

    async def _follow(self, watcher: KeyValue.KeyWatcher) -> None:
        async for entry in watcher:
            if entry is not None:
                self._take(entry.key)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await stop_task(task)

    async def refresh(self) -> None:
        """Bind to the consumers of the levels the watch found that are new here, their
        AckWait raised to this consumer's window."""
        if len(self._found) == len(self._subs):
            return
        names = self._names
        for level in sorted(self._found - set(self._subs)):
            durable = names.consumer_for(level)
            await self.set_ack_wait(level, self._windows.ack_wait)
            self._subs[level] = await self._js.pull_subscribe_bind(durable, names.stream)
            self._peeks[level] = NoWaitPull(self._nc, names.stream, durable)
        self.active = tuple(sorted(self._subs, reverse=True))

    async def set_ack_wait(self, level: int, ack_wait: float) -> None:
        names = self._names
        args = (names.stream, names.consumer_for(level), names.subject_for(level))
        await ensure_consumer(self._js, *args, ack_wait, self.exact, self._max_deliver)

    async def raise_ack_wait(self, ack_wait: float) -> None:
        """Every known level's AckWait raised to ``ack_wait`` (the workers' lease TTL)."""
        for level in self._subs:
            await self.set_ack_wait(level, ack_wait)

    # -- fetching --------------------------------------------------------------------------

    async def _pull(
        self, sub: JetStreamContext.PullSubscription, level: int, count: int, wait: float
    ) -> list[Delivery]:
        sent = time.monotonic()
        try:
            msgs: list[Msg] = await pull(sub, count, wait)
        except asyncio.CancelledError:
            self._windows.cancelled(sent, max(wait, 0.01))
            raise
        return self._received(msgs, sent, level)

    def _received(self, msgs: list[Msg], sent: float, level: int) -> list[Delivery]:
        out = self._windows.received(msgs, sent)
        if level:
            for d in out:
                d.level = level
        return out

    async def _peek(
        self, sub: JetStreamContext.PullSubscription, level: int, count: int
    ) -> list[Delivery]:
        """Up to ``count`` deliveries of what ``level`` holds now, without waiting for any:
        first those a timed pull of ``sub`` that ended on the client left in its buffer,
        then a no-wait pull (a message of a look cancelled on its way comes back after its
        AckWait)."""
        got = await self._pull(sub, level, count, PEEK) if sub.pending_msgs else []
        if len(got) < count:
            sent = time.monotonic()
            msgs = await self._peeks[level].take(count - len(got), PEEK_ANSWER)
            got += self._received(msgs, sent, level)
        return got

    async def _pass(
        self, base: JetStreamContext.PullSubscription, count: int, share: float
    ) -> list[Delivery]:
        """What the levels hold now, highest first (a share turn: the lowest with jobs
        first), each looked at without waiting; only the levels whose subject holds
        messages (one read of the stream's subject counts: an empty level costs no pull)."""
        held = await self._held_subjects()
        order: list[tuple[int, JetStreamContext.PullSubscription]] = [
            (lv, sub)
            for lv, sub in (*((lv, self._subs[lv]) for lv in self.active), (0, base))
            if held.get(self._names.subject_for(lv), 0) > 0
        ]
        got: list[Delivery] = []
        if self._credit.turn(share):
            for level, sub in reversed(order):
                got = await self._peek(sub, level, count)
                if got:
                    order = [(lv, s) for lv, s in order if lv != level]
                    break
        for level, sub in order:
            if len(got) >= count:
                break
            got += await self._peek(sub, level, count - len(got))
        return got

    async def _held_subjects(self) -> dict[str, int]:
        """Messages per subject of the queue's stream (those in flight count too: a
        work-queue stream keeps a message until its ack)."""
        info = await self._js.stream_info(self._names.stream, subjects_filter=">")
        return dict(info.state.subjects or {})

    async def fetch(
        self, base: JetStreamContext.PullSubscription, count: int, block: float, share: float
    ) -> list[Delivery]:
        """Up to ``count`` deliveries across the levels (``base``: level 0's consumer),
        waiting up to ``block`` seconds (in slices on the highest level when there are
        several). A queue with one level pulls from its consumer, as without levels."""
        await self.refresh()
        if not self.active:
            deadline = time.monotonic() + block
            while True:  # in slices: a request lost with a server holds up one slice
                left = deadline - time.monotonic()
                got = await self._pull(base, 0, count, min(PULL_SLICE, left))
                if got or left <= PULL_SLICE:
                    return got
        deadline = time.monotonic() + block
        top = self.active[0]
        while True:
            got = await self._pass(base, count, share)
            left = deadline - time.monotonic()
            if got or left <= 0:
                return got
            got = await self._pull(self._subs[top], top, count, min(SLICE, left))
            if got:
                return got

    async def counts(self) -> tuple[int, int]:
        """(waiting, in flight) summed over the levels' consumers."""
        await self.refresh()
        waiting = in_flight = 0
        names = self._names
        for level in (0, *self.active):
            info = await self._js.consumer_info(names.stream, names.consumer_for(level))
            waiting += int(info.num_pending or 0)
            in_flight += int(info.num_ack_pending or 0)
        return waiting, in_flight
