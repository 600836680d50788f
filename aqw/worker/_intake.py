"""How jobs reach a worker's slots: the fetch loop (with backpressure, and the end of a
burst), the loop that moves due delayed jobs into the queue, and crash recovery."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from .._text import plural
from ..brokers.base import Broker, Delivery
from ..job import Job
from ..telemetry import Telemetry, now_ns
from ._backoff import Backoff
from ._outage import Outage
from ._slots import Slots

log = logging.getLogger("aqw.worker")

#: In burst mode, delayed jobs due within this many seconds are waited for.
BURST_HORIZON = 10.0
#: Seconds between a worker's reads of its queue's pause flag (``broker.control``): a
#: paused queue is fetched from no more within about this long, at one read per poll.
PAUSE_POLL = 1.0


class Intake:
    """The background loops that feed ``slots`` from ``broker`` until ``stop`` is set.

    Args:
        prefetch: deliveries fetched ahead of free slots.
        burst: set ``stop`` once the queue is empty (delayed jobs due soon included).
        lease_ttl: the lease TTL of a job (``None``: one that does not decode).
        min_ttl: the shortest lease TTL of the app's tasks: recovery scans several times
            per that TTL, and claims each job once its own lease has lapsed.
        outage: the worker's outage reporter: the loops tell it of each failed and each
            successful broker call, and it does the logging (one warning per outage).
        retry_due: when the latest retry this worker made is due (epoch seconds, 0: none);
            a burst does not end while one is due soon or just came due.
    """

    def __init__(
        self,
        broker: Broker,
        slots: Slots,
        stop: asyncio.Event,
        tel: Telemetry,
        *,
        prefetch: int,
        burst: bool,
        lease_ttl: Callable[[Job | None], float],
        min_ttl: float,
        outage: Outage | None = None,
        retry_due: Callable[[], float] = lambda: 0.0,
        share: float = 0.0,
    ) -> None:
        self.broker = broker
        self.slots = slots
        self.stop = stop
        self.tel = tel
        self.prefetch = prefetch
        self.burst = burst
        self.lease_ttl = lease_ttl
        self.min_ttl = min_ttl
        self.outage = outage if outage is not None else Outage(broker.describe())
        self.transient = broker.transient_errors
        self.next_due: float | None = None
        self.retry_due = retry_due
        #: The lower priority levels' share of fetches (``Broker.fetch``).
        self.share = share
        self._idle_fetches = 0
        #: The queue is paused (``aqw queue pause``): nothing is fetched or reclaimed.
        self.paused = False
        self._resumed = asyncio.Event()
        self._resumed.set()

    async def _read_pause(self) -> None:
        control = self.broker.control
        if control is None:
            return
        try:
            paused = await control.paused()
        except self.transient:
            return  # the fetch loop reports the outage
        if paused == self.paused:
            return
        self.paused = paused
        if paused:
            self._resumed.clear()
            log.info("queue %s is paused: fetching no more jobs until it is resumed", self.queue)
        else:
            self._resumed.set()
            log.info("queue %s is resumed: fetching jobs again", self.queue)

    @property
    def queue(self) -> str:
        return self.broker.queue

    async def pause_loop(self) -> None:
        """Read the queue's pause flag every ``PAUSE_POLL`` seconds (no loop without a
        ``broker.control``)."""
        if self.broker.control is None:
            return
        while not self.stop.is_set():
            await asyncio.sleep(PAUSE_POLL)
            await self._read_pause()

    async def _wait_resumed(self) -> None:
        slots = self.slots
        if self.burst and not slots.in_flight and not slots.buffered:
            log.info("burst: the queue is paused; stopping")
            self.stop.set()
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(PAUSE_POLL):
                await self._resumed.wait()

    async def _hand_back(self, deliveries: list[Delivery]) -> None:
        """Give back what a fetch returned as the queue was paused (unstarted: the same
        attempt, at once); one that cannot be given back now is reclaimed later."""
        for delivery in deliveries:
            try:
                await self.broker.give_back(delivery, None)
            except self.transient:
                continue

    async def fetch_loop(self) -> None:
        backoff = Backoff()
        slots = self.slots
        await self._read_pause()  # a worker started on a paused queue fetches nothing
        while not self.stop.is_set():
            if self.paused:
                await self._wait_resumed()
                continue
            slots.start_buffered()
            want = slots.free + self.prefetch - slots.buffered
            if slots.free <= 0 or want <= 0 or not slots.ready:
                await slots.wait_free()
                continue
            try:
                fetch_started = now_ns() if self.tel.tracing else 0
                deliveries = await self.broker.fetch(want, 0.25 if self.burst else 2.0, self.share)
                if fetch_started and deliveries:
                    received = (fetch_started, now_ns())
                    for delivery in deliveries:
                        delivery.received = received
            except self.transient as exc:
                self.outage.failed("fetch", exc)
                await asyncio.sleep(backoff.next())
                continue
            self.outage.ok()
            backoff.reset()
            if self.paused and deliveries:  # paused while this fetch waited: not ours to run
                await self._hand_back(deliveries)
                continue
            for delivery in deliveries:
                slots.offer(delivery)
            if self.burst:
                await self._check_burst_done(bool(deliveries))

    async def _check_burst_done(self, got_work: bool) -> None:
        slots = self.slots
        if got_work or slots.in_flight or slots.buffered:
            self._idle_fetches = 0
            return
        self._idle_fetches += 1
        if self._idle_fetches < 2:
            return
        due = self.retry_due()
        # Past its due time, an empty queue is believed at once where the counts are exact;
        # a broker whose counts lag (SQS) is given its ``depth_lag`` first.
        if due - BURST_HORIZON < time.time() < due + self.broker.depth_lag:
            return
        try:
            depth = await self.broker.depth()
        except self.transient:
            return
        if depth.waiting or depth.in_flight:
            return
        if depth.delayed:
            try:
                wait = await self.broker.promote_due()
            except self.transient:
                return
            if wait is None or wait < BURST_HORIZON:
                # Due soon (a retry, a delayed job: part of this burst), or just moved to
                # the queue by this very call: look again on the next pass.
                return
        if not slots.buffered and not slots.in_flight:
            log.info("burst: the queue is empty; stopping")
            self.stop.set()

    async def promote_loop(self) -> None:
        backoff = Backoff()
        while not self.stop.is_set():
            try:
                wait = await self.broker.promote_due()
            except self.transient as exc:
                self.outage.failed("moving due jobs", exc)
                await asyncio.sleep(backoff.next())
                continue
            self.outage.ok()
            backoff.reset()
            self.next_due = None if wait is None else time.time() + wait
            await asyncio.sleep(0.05 if wait is None else min(wait, 0.05))

    async def reclaim_loop(self) -> None:
        """Take over jobs whose consumer stopped: each once its own lease has lapsed (the
        broker checks the lease key atomically with the claim)."""
        interval = min(max(self.min_ttl / 4, 0.1), 5.0)
        slots = self.slots
        while not self.stop.is_set():
            await asyncio.sleep(interval)
            if self.paused:
                continue
            # Under a backlog the fetch refills every slot first: a stopped consumer's jobs
            # waited for the whole backlog to drain. Then one at a time goes to the buffer
            # (it starts at the next free slot, before the fetch takes more), up to a
            # buffer of ``concurrency``.
            free = slots.free - slots.buffered
            want = free if free > 0 else int(slots.buffered < slots.concurrency)
            if want <= 0:
                continue
            try:
                deliveries = await self.broker.reclaim(want, self.lease_ttl, self.min_ttl)
            except self.transient as exc:
                self.outage.failed("reclaiming abandoned jobs", exc)
                continue
            self.outage.ok()
            if deliveries:
                log.info(
                    "reclaimed %s abandoned by a stopped consumer",
                    plural(len(deliveries), "job"),
                )
            for delivery in deliveries:
                slots.offer(delivery)
