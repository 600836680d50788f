"""``LeaseKeeper``: one task that renews many leases, and one timer that stops their blocks
at their deadlines, so a worker running thousands of jobs runs no timer per job."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol


class Renewable(Protocol):
    """What a keeper needs of a lease (``aqw.Lease`` has it)."""

    @property
    def renewing(self) -> bool: ...
    @property
    def next_renewal(self) -> float: ...
    @property
    def deadline(self) -> float:
        """Loop time at which the lease's block must be stopped (inf: none to stop)."""

    def expire(self) -> None:
        """The deadline passed with no renewal confirmed: stop the block."""

    async def renew_once(self) -> None: ...


class LeaseKeeper:
    """Renews many leases from one task, so a worker running thousands of jobs does not
    need a timer task per job. Renewals due together share one pipelined round trip when
    the backend batches commands.

    It also keeps one timer, in the loop's timer heap, at the earliest deadline of its
    leases (``watch``), instead of one per lease: when it fires, every lease past its
    deadline is expired at once, so after a pause the blocks are stopped in the same loop
    iteration, ahead of their own later timers, as a timer of their own would."""

    def __init__(self) -> None:
        self._leases: set[Renewable] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._steps: set[asyncio.Task[None]] = set()
        self._target = float("inf")
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_at = float("inf")

    def __len__(self) -> int:
        return len(self._leases)

    def leases(self) -> list[Renewable]:
        """The leases being renewed now."""
        return list(self._leases)

    def add(self, lease: Renewable) -> None:
        self._leases.add(lease)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="aqw-lease-keeper")
        self.reschedule(lease)

    def reschedule(self, lease: Renewable) -> None:
        """Wake the keeper early when ``lease`` is due before its next planned pass."""
        if lease.next_renewal < self._target:
            self._wake.set()

    def discard(self, lease: Renewable) -> None:
        self._leases.discard(lease)

    def watch(self, lease: Renewable) -> None:
        """Expire ``lease`` (one of this keeper's) once its deadline passes; call again
        when its deadline moves earlier. A later deadline needs no call: the timer, when
        it fires, looks at every lease's deadline as it is then."""
        if lease.deadline < self._expiry_at:
            self._arm(lease.deadline)

    def _arm(self, when: float) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry_at = when
        self._expiry = asyncio.get_running_loop().call_at(when, self._expire_due)

    def _expire_due(self) -> None:
        self._expiry, self._expiry_at = None, float("inf")
        now = asyncio.get_running_loop().time()
        next_at = float("inf")
        for lease in list(self._leases):
            deadline = lease.deadline
            if deadline <= now:
                lease.expire()
            elif deadline < next_at:
                next_at = deadline
        if next_at < float("inf"):
            self._arm(next_at)

    async def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry, self._expiry_at = None, float("inf")
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for step in list(self._steps):
            step.cancel()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            t = loop.time()
            next_due = t + 1.0
            for lease in list(self._leases):
                if lease.renewing:
                    continue
                if lease.next_renewal <= t:
                    step = loop.create_task(lease.renew_once())
                    self._steps.add(step)
                    step.add_done_callback(self._steps.discard)
                else:
                    next_due = min(next_due, lease.next_renewal)
            self._target = next_due
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.001, next_due - loop.time())):
                    await self._wake.wait()
            self._target = float("inf")
