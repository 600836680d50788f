"""A job's start under its lease in the process, for brokers whose job records are
``LocalJobRecords``: ``LocalStartGuard`` (a start only for a live delivery: take the lease
and mark the record running, or refuse a cancelled job, a delivery no longer this
consumer's or an ended job, taking nothing) and ``LimitedStart`` (admit the job under its
rate limit and per-key caps first, ``LocalLimiter``). What ``Broker.job_lease_backend`` of
the memory broker returns, and of a broker written outside aqw that keeps its records here:

    def job_lease_backend(self, job, limits=None, delivery=None):
        check = still_ours(self, delivery)
        start = LocalStartGuard(self.lease_backend(), self.records, job, self.consumer, check)
        return start if limits is None else LimitedStart(start, limiter, limits, leases.owner)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from ...errors import JobCancelled, StaleStart
from ...flow import Limits
from ...job import Job
from ...lease import Lease, LeaseBackend
from ..messages import Delivery
from .clock import clock
from .limits import Alive, LocalLimiter
from .records import LocalJobRecords

#: A start guard's check of its delivery (``LocalStartGuard``), run before the lease is
#: taken: True while the delivery is still this consumer's; with ``drop`` True (its job has
#: ended) it is also removed, unrun, touching no record.
DeliveryCheck = Callable[[bool], Awaitable[bool]]


class Holder(Protocol):
    """What ``still_ours`` asks of a broker: whether it still holds a delivery, and the
    settle step that drops one unrun."""

    async def keep_alive(self, delivery: Delivery) -> bool: ...

    async def ack(self, delivery: Delivery, job: Job | None, lease: Lease | None) -> bool: ...


def still_ours(broker: Holder, delivery: Delivery | None) -> DeliveryCheck | None:
    """The ``LocalStartGuard`` check of ``delivery`` on ``broker``: ``keep_alive`` says
    whether it is still this consumer's; an ended job's delivery is dropped with an ``ack``
    naming no job (no record is touched). None without a delivery: nothing to check."""
    if delivery is None:
        return None

    async def check(drop: bool) -> bool:
        if drop:
            return await broker.ack(delivery, None, None)
        return await broker.keep_alive(delivery)

    return check


class LocalStartGuard:
    """A job's lease backend whose ``acquire`` also marks the job running in ``records``
    (and refuses a cancelled job with ``JobCancelled``, taking nothing), and whose
    ``renew`` moves the record's lease expiry on.

    With ``delivery`` (the check of the delivery being started), a start whose delivery is no
    longer this consumer's, or whose job has ended, raises ``StaleStart`` and takes nothing
    (an ended job's delivery, still ours, is dropped). The checks, the lease and the record
    are one step when ``delivery`` and the backend do not wait (the memory broker's)."""

    __slots__ = ("_backend", "_delivery", "_fence", "_job", "_records", "_worker")

    def __init__(
        self,
        backend: LeaseBackend,
        records: LocalJobRecords,
        job: Job,
        worker: str,
        delivery: DeliveryCheck | None = None,
    ):
        self._backend = backend
        self._records = records
        self._job = job
        self._worker = worker
        self._delivery = delivery
        self._fence: int | None = None

    async def check(self) -> None:
        """Raise ``JobCancelled`` or ``StaleStart`` when the job must not start now."""
        job_id, mine = self._job.id, self._delivery
        if mine is not None and not await mine(False):
            raise StaleStart(job_id)
        if self._records.is_cancelled(job_id):
            raise JobCancelled(job_id)
        if self._records.has_ended(job_id):
            if mine is not None:
                await mine(True)
            raise StaleStart(job_id, ended=True)

    async def acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        await self.check()
        fence = await self._backend.acquire(key, token, ttl_ms)
        if fence is not None:
            try:
                self._records.started(self._job, self._worker, fence, clock.time() + ttl_ms / 1000)
            except JobCancelled:  # cancelled while the acquire was on its way
                await self._backend.release(key, token)
                raise
            self._fence = fence
        return fence

    async def renew(self, key: str, token: str, ttl_ms: int) -> bool:
        renewed = await self._backend.renew(key, token, ttl_ms)
        if renewed and self._fence is not None:
            expires = {"lease_expires_at": repr(clock.time() + ttl_ms / 1000)}
            self._records.update(self._job.id, expires, self._fence)
        return renewed

    async def release(self, key: str, token: str) -> bool:
        return await self._backend.release(key, token)


class LimitedStart:
    """A job's lease backend that admits the job under its ``limits`` (``LocalLimiter``)
    before ``inner`` (the broker's start guard) takes the lease; refused: raises
    ``aqw.RateLimited``, taking nothing. ``alive(lease_key)``: the token holding it, if any.
    A lease another token holds is refused first, as on Redis (not deferred: the other holder
    runs the job)."""

    __slots__ = ("_alive", "_inner", "_limiter", "_limits")

    def __init__(
        self, inner: LocalStartGuard, limiter: LocalLimiter, limits: Limits, alive: Alive
    ) -> None:
        self._inner = inner
        self._limiter = limiter
        self._limits = limits
        self._alive = alive

    async def acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        await self._inner.check()  # a stale or cancelled start is refused before any limit
        holder = self._alive(key)
        if holder is not None and holder != token:
            return None
        refused = self._limiter.refusal(self._limits, key, self._alive)
        if refused is not None:
            raise refused
        fence = await self._inner.acquire(key, token, ttl_ms)
        if fence is not None:
            self._limiter.admit(self._limits, key, self._alive)
        return fence

    async def renew(self, key: str, token: str, ttl_ms: int) -> bool:
        return await self._inner.renew(key, token, ttl_ms)

    async def release(self, key: str, token: str) -> bool:
        return await self._inner.release(key, token)
