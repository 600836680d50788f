"""``LeaseKeeper``: one task that renews many leases, and one timer that stops their blocks
at their deadlines, so a worker running thousands of jobs runs no timer per job; and
``RenewalTimes``: how long a worker's renewals take, which moves them earlier on a slow link.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

log = logging.getLogger("aqw.lease")

#: Renewal timeouts (``RenewalTimes.timeout``) left between a renewal's send and its lease's
#: expiry: one for the renewal, slow as it may be, and one for a retry after a failed try.
MARGIN_TIMEOUTS = 2


class RenewalTimes:
    """The round trips of one worker's lease acquires and renewals (its ``LeaseKeeper``'s;
    a lease with no keeper has its own), smoothed as TCP does it (RFC 6298): ``srtt`` and
    ``rttvar``, and ``timeout`` = ``srtt + 4 * rttvar``, the time a renewal may take, stalls
    included, before it is late. Each renewal goes out early enough to leave
    ``MARGIN_TIMEOUTS`` of that before its lease expires (``renew_after``). The first
    renewal that took more than a third of the time its lease had left is reported, once,
    with the numbers."""

    def __init__(self) -> None:
        self.srtt = 0.0
        self.rttvar = 0.0
        self.warned = False

    @property
    def timeout(self) -> float:
        return self.srtt + 4 * self.rttvar

    def took(
        self, seconds: float, margin: float | None = None, key: str = "", ttl: float = 0.0
    ) -> None:
        """A round trip of ``seconds``: an acquire's, or the renewal of lease ``key`` (of
        ``ttl`` seconds) sent with ``margin`` seconds left on it."""
        if self.srtt == 0.0:
            self.srtt, self.rttvar = seconds, seconds / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - seconds)
            self.srtt = 0.875 * self.srtt + 0.125 * seconds
        if margin is not None and seconds > margin / 3 and not self.warned:
            self.warned = True
            log.warning(
                "lease renewals are slow for their margin: renewing %r (ttl %.1f s) took %.0f "
                "ms of the %.0f ms its lease had left (round trips: %.0f ms smoothed, %.0f ms "
                "with their variation); renewals now go out at least %d of those before the "
                "expiry. Over a link this slow raise lease_ttl (docs/concepts/leases.md, "
                "sizing lease_ttl)",
                key,
                ttl,
                seconds * 1000,
                margin * 1000,
                self.srtt * 1000,
                self.timeout * 1000,
                MARGIN_TIMEOUTS,
            )

    def renew_after(self, ttl: float, every: float) -> float:
        """Seconds from a renewal's send to the next one's: ``every``, or sooner, so that
        ``MARGIN_TIMEOUTS`` renewal timeouts are left before the lease expires (never sooner
        than a tenth of ``ttl``, or ``every`` when that is shorter: past that only a longer
        TTL helps)."""
        return max(min(ttl / 10, every), min(every, ttl - MARGIN_TIMEOUTS * self.timeout))


class Renewable(Protocol):
    """What a keeper needs of a lease (``aqw.Lease`` has it)."""

    @property
    def renewing(self) -> bool: ...
    @property
    def next_renewal(self) -> float: ...
    @property
    def renew_early(self) -> float:
        """Seconds before ``next_renewal`` it may be renewed, with others due then."""

    @property
    def deadline(self) -> float:
        """Loop time at which the lease's block must be stopped (inf: none to stop)."""

    def expire(self) -> None:
        """The deadline passed with no renewal confirmed: stop the block."""

    async def renew_once(self) -> None: ...


class LeaseKeeper:
    """Renews many leases from one task, so a worker running thousands of jobs does not
    need a timer task per job. Renewals due together share one pipelined round trip when
    the backend batches commands, and a lease due soon (within its ``renew_early``) is
    renewed with those due now, so renewals go out in fewer, fuller round trips.

    It also keeps one timer, in the loop's timer heap, at the earliest deadline of its
    leases (``watch``), instead of one per lease: when it fires, every lease past its
    deadline is expired at once, so after a pause the blocks are stopped in the same loop
    iteration, ahead of their own later timers, as a timer of their own would."""

    def __init__(self) -> None:
        #: How long this keeper's renewals take (shared by its leases).
        self.times = RenewalTimes()
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
                if lease.next_renewal - lease.renew_early <= t:  # due, or soon: renewed together
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
