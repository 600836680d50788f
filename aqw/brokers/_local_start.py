"""A job's start for brokers whose job records are kept in the process (``LocalRecords``):
``LocalStartGuard``, the default of ``Broker.job_lease_backend``."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from ..errors import JobCancelled, StaleStart
from ..job import Job
from ..lease import LeaseBackend
from ._local_records import LocalRecords

#: A start guard's check of its delivery (``LocalStartGuard``), run before the lease is
#: taken: True while the delivery is still this consumer's; with ``drop`` True (its job has
#: ended) it is also removed, unrun, touching no record.
DeliveryCheck = Callable[[bool], Awaitable[bool]]


class LocalStartGuard:
    """A job's lease backend whose ``acquire`` also marks the job running in ``records``
    (and refuses a cancelled job with ``JobCancelled``, taking nothing), and whose
    ``renew`` moves the record's lease expiry on: the default of ``Broker.job_lease_backend``.

    With ``delivery`` (the check of the delivery being started), a start whose delivery is no
    longer this consumer's, or whose job has ended, raises ``StaleStart`` and takes nothing
    (an ended job's delivery, still ours, is dropped). The checks, the lease and the record
    are one step when ``delivery`` and the backend do not wait (the memory broker's)."""

    __slots__ = ("_backend", "_delivery", "_fence", "_job", "_records", "_worker")

    def __init__(
        self,
        backend: LeaseBackend,
        records: LocalRecords,
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
