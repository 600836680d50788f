"""A job's start under its lease in the process, for brokers whose job records are
``LocalJobRecords``: ``LocalStartGuard`` (take the lease and mark the record running, or
refuse a cancelled job, taking nothing) and ``LimitedStart`` (admit the job under its rate
limit and per-key caps first, ``LocalLimiter``). What ``Broker.job_lease_backend`` of the
memory broker returns, and of a broker written outside aqw that keeps its records here:

    def job_lease_backend(self, job, limits=None):
        start = LocalStartGuard(self.lease_backend(), self.records, job, self.consumer)
        return start if limits is None else LimitedStart(start, limiter, limits, leases.owner)
"""

from __future__ import annotations

import time

from ...errors import JobCancelled
from ...flow import Limits
from ...job import Job
from ...lease import LeaseBackend
from .limits import Alive, LocalLimiter
from .records import LocalJobRecords


class LocalStartGuard:
    """A job's lease backend whose ``acquire`` also marks the job running in ``records``
    (and refuses a cancelled job with ``JobCancelled``, taking nothing), and whose
    ``renew`` moves the record's lease expiry on."""

    __slots__ = ("_backend", "_fence", "_job", "_records", "_worker")

    def __init__(self, backend: LeaseBackend, records: LocalJobRecords, job: Job, worker: str):
        self._backend = backend
        self._records = records
        self._job = job
        self._worker = worker
        self._fence: int | None = None

    async def acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        if self._records.is_cancelled(self._job.id):
            raise JobCancelled(self._job.id)
        fence = await self._backend.acquire(key, token, ttl_ms)
        if fence is not None:
            try:
                self._records.started(self._job, self._worker, fence, time.time() + ttl_ms / 1000)
            except JobCancelled:  # cancelled while the acquire was on its way
                await self._backend.release(key, token)
                raise
            self._fence = fence
        return fence

    async def renew(self, key: str, token: str, ttl_ms: int) -> bool:
        renewed = await self._backend.renew(key, token, ttl_ms)
        if renewed and self._fence is not None:
            expires = {"lease_expires_at": repr(time.time() + ttl_ms / 1000)}
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
        self, inner: LeaseBackend, limiter: LocalLimiter, limits: Limits, alive: Alive
    ) -> None:
        self._inner = inner
        self._limiter = limiter
        self._limits = limits
        self._alive = alive

    async def acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
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
