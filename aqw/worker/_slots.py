"""A worker's job slots: at most ``concurrency`` jobs run at once, each in its own task, and
up to ``prefetch`` more wait in a buffer for a slot to free.

A job whose handler has returned gives its slot back as its settle starts (up to
``concurrency`` of them at once): the next fetch and the next starts go out while the
settles' round trips are on their way, instead of after them. The handlers running never
pass ``concurrency``; a settling job keeps its lease until its settle is done, and a job
under a per-key cap keeps its slot too (the next job of its key would only be refused)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from .._text import plural
from ..brokers.base import Broker, Delivery

log = logging.getLogger("aqw.worker")

#: Runs one delivery in a slot.
Runner = Callable[[Delivery], Coroutine[Any, Any, None]]


class Slots:
    """Job tasks, the fetch buffer, and the event that says a slot came free."""

    def __init__(self, concurrency: int, run: Runner) -> None:
        self.concurrency = concurrency
        self._run = run
        self.jobs: dict[asyncio.Task[None], str] = {}  # job task -> its delivery id
        #: Jobs that finished running and are settling: a shutdown must not cancel them.
        self.settling: set[asyncio.Task[Any]] = set()
        #: Settling jobs whose slot has gone to the next job (at most ``concurrency``).
        self._handed_on: set[asyncio.Task[Any]] = set()
        self._busy = 0  # slots held: the jobs running, and those settling in their slot
        #: Slots held at most for a settle's hand-on to wake the fetch: half of them free.
        self._refill_at = concurrency // 2
        self._buffer: deque[Delivery] = deque()
        self._freed = asyncio.Event()
        self._on_done = self._done  # one bound method for every job task, not one each

    @property
    def in_flight(self) -> int:
        """Jobs running or settling now."""
        return len(self.jobs)

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    @property
    def free(self) -> int:
        """Slots free now: those no job holds, and those handed on by jobs settling."""
        return self.concurrency - self._busy

    @property
    def ready(self) -> bool:
        """Whether a fetch is worth it now: a slot no job holds, or half the slots handed on
        by jobs settling (so the jobs fetched while acks are on their way come as a batch,
        not one at a time, and are started and settled in batches too)."""
        return len(self.jobs) < self.concurrency or self._busy <= self._refill_at

    def settle_started(self, task: asyncio.Task[Any], frees: bool = True) -> None:
        """``task``'s handler has returned and its settle starts: a shutdown must not cancel
        it, and (``frees``) its slot is free for the next job. A job under a per-key cap
        keeps its slot to the end of its settle: the next job of its key would be refused
        (and put off) while its lease still counts."""
        self.settling.add(task)
        if frees and len(self._handed_on) < self.concurrency:
            self._handed_on.add(task)
            self._busy -= 1
            if self._busy <= self._refill_at:  # the fetch takes a batch, not a job at a time
                self._freed.set()

    def offer(self, delivery: Delivery) -> None:
        """Start ``delivery`` in a free slot, or buffer it until one frees."""
        if self.free > 0:
            self._start(delivery)
        else:
            self._buffer.append(delivery)

    def start_buffered(self) -> None:
        """Move buffered deliveries into the free slots."""
        while self.free > 0 and self._buffer:
            self._start(self._buffer.popleft())

    async def wait_free(self) -> None:
        """Wait until a running job ends or starts to settle."""
        self._freed.clear()
        await self._freed.wait()

    async def give_back_buffer(self, broker: Broker) -> None:
        """Hand every buffered delivery back to the broker (the worker is stopping)."""
        while self._buffer:
            delivery = self._buffer.popleft()
            with contextlib.suppress(Exception):
                await broker.give_back(delivery, None)

    async def cancel(self, pending: set[asyncio.Task[None]], grace: float, within: float) -> None:
        """Cancel jobs still running after the grace period (they hand themselves back for
        immediate redelivery), again each second until they exit or ``within`` seconds pass,
        but let a job that is already settling finish: it is done, and cancelling it now
        would only make it run again."""
        running = {t for t in pending if t not in self.settling}
        log.warning("cancelling %s still running after %.1fs", plural(len(running), "job"), grace)
        deadline = time.monotonic() + within
        while pending and time.monotonic() < deadline:
            for task in pending:
                if task not in self.settling:
                    task.cancel()  # again each pass: a client may swallow one cancellation
            _, pending = await asyncio.wait(pending, timeout=1.0)
        if pending:
            log.error(
                "%s not stop; abandoning them to redelivery",
                plural(len(pending), "job did", "jobs did"),
            )

    def _start(self, delivery: Delivery) -> None:
        task = asyncio.get_running_loop().create_task(self._run(delivery))
        self.jobs[task] = delivery.id
        self._busy += 1
        task.add_done_callback(self._on_done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.jobs.pop(task, None)
        self.settling.discard(task)
        if task in self._handed_on:
            self._handed_on.discard(task)
        else:
            self._busy -= 1
        self._freed.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("job runner crashed", exc_info=task.exception())
