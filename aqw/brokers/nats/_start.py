"""The start step on JetStream (``NatsStart``, what ``job_lease_backend`` returns): a start
only for a live delivery. In order, each refusal taking nothing:

1. the delivery's window is still open, by its confirmed end (``_window.py``: no round
   trip), else ``StaleStart``;
2. what this process knows of the record (no round trip) is not cancelled
   (``JobCancelled``) nor ended (``StaleStart`` with ``ended``; the delivery, still ours,
   is dropped unrun);
3. the job's lease key is taken (``KvLeaseBackend``: its revision is the fencing token), or
   None when another holder has it; under a task's limits, a slot of each cap and a turn of
   its rate are taken next (``_limits.py``), a refusal releasing the lease
   (``aqw.RateLimited``);
4. the record is read and marked running by compare-and-set (``KvJobRecords.started``): a
   cancel or an end written by any process is seen there, refused as in step 2, and the
   lease just taken is released (the token it took is handed to nobody).

JetStream has no transaction across a stream and a bucket, so these are three round trips,
not one step; each race between them is settled by a revision (the module docstrings of
``_records.py`` and ``_leases.py``)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from ...errors import JobCancelled, StaleStart
from ...flow import Limits
from ...job import Job
from ...record import FINAL_STATES
from ..local.start import DeliveryCheck
from ..messages import Delivery
from ._leases import KvLeaseBackend
from ._limits import KvLimiter
from ._records import KvJobRecords
from ._window import Windows


def still_ours(
    windows: Windows, drop: Callable[[Delivery], Awaitable[bool]], delivery: Delivery | None
) -> DeliveryCheck | None:
    """The start's check of its delivery: its window still open, by the confirmed end
    this consumer keeps (no round trip: the lease keeper renews it from the start on);
    an ended job's delivery is dropped with ``drop`` (an ack naming no job)."""
    if delivery is None:
        return None

    async def check(dropping: bool) -> bool:
        if dropping:
            return await drop(delivery)
        return windows.hold(delivery) is not None

    return check


class NatsStart:
    """A job's lease backend whose ``acquire`` is the start step (module docstring) and
    whose ``renew`` moves the record's lease expiry on."""

    __slots__ = (
        "_delivery",
        "_enqueued_revision",
        "_fence",
        "_flow",
        "_job",
        "_leases",
        "_records",
        "_worker",
    )

    def __init__(
        self,
        leases: KvLeaseBackend,
        records: KvJobRecords,
        job: Job,
        worker: str,
        delivery: DeliveryCheck | None,
        limits: tuple[KvLimiter, Limits] | None = None,
        enqueued_revision: int | None = None,
    ) -> None:
        self._enqueued_revision = enqueued_revision
        self._leases = leases
        self._flow = limits
        self._records = records
        self._job = job
        self._worker = worker
        self._delivery = delivery
        self._fence: int | None = None

    async def acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        job_id, mine = self._job.id, self._delivery
        if mine is not None and not await mine(False):
            raise StaleStart(job_id)
        fields = self._records.known(job_id)  # what this process knows, if anything
        if fields is not None:
            if fields.get("state") == "cancelled" or fields.get("cancel") == "1":
                raise JobCancelled(job_id)
            if fields.get("state") in FINAL_STATES:
                if mine is not None:
                    await mine(True)
                raise StaleStart(job_id, ended=True)
        fence = await self._leases.acquire(key, token, ttl_ms)
        if fence is None:
            return None
        if self._flow is not None:
            refused = await self._flow[0].refusal(self._flow[1], key, token)
            if refused is not None:
                await self._leases.release(key, token)  # which frees the slots taken
                raise refused
        try:
            expires = time.time() + ttl_ms / 1000
            await self._records.started(
                self._job, self._worker, fence, expires, self._enqueued_revision
            )
        except StaleStart:
            await self._leases.release(key, token)
            if mine is not None:
                await mine(True)
            raise
        except BaseException:
            await self._leases.release(key, token)
            raise
        self._fence = fence
        return fence

    async def renew(self, key: str, token: str, ttl_ms: int) -> bool:
        renewed = await self._leases.renew(key, token, ttl_ms)
        if renewed and self._fence is not None:
            expires = {"lease_expires_at": repr(time.time() + ttl_ms / 1000)}
            await self._records.update(self._job.id, expires, self._fence)
        return renewed

    async def release(self, key: str, token: str) -> bool:
        return await self._leases.release(key, token)
