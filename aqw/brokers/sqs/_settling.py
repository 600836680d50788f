"""Settling deliveries (``Settler``): each step stops tracking the message, settles it on SQS
(a delete, or a visibility change), frees the job's lease in the lock store, is counted, and
moves the job's record (kept in the process: ``Broker.local_records``)."""

from __future__ import annotations

import logging
import math
import time

from ...job import Job
from ...lease import Lease
from ..base import Delivery, Failure, Finish, failure_fields
from ..local.records import LocalRecords
from ._connection import Connection
from ._dead_letters import DeadLetters
from ._held import HeldMessages
from ._keys import Keys
from ._leases import LockStore
from ._limits import MAX_VISIBILITY
from ._queues import Queues

log = logging.getLogger("aqw.sqs")


class Settler:
    """SQSBroker's ``ack``, ``retry``, ``defer``, ``dead_letter`` and ``requeue``. Each
    returns False (``dead_letter``: None), touching nothing, when another holder runs the
    job now; ``counts`` are what it did."""

    def __init__(
        self,
        connection: Connection,
        queues: Queues,
        held: HeldMessages,
        locks: LockStore,
        dead_letters: DeadLetters,
        keys: Keys,
        records: LocalRecords,
    ) -> None:
        self._connection = connection
        self._queues = queues
        self._held = held
        self._locks = locks
        self._dead_letters = dead_letters
        self._keys = keys
        self._records = records
        self.counts: dict[str, int] = {}

    def _bump(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    async def ack(
        self,
        delivery: Delivery,
        job: Job | None,
        lease: Lease | None,
        record_ttl: float,
        finish: Finish,
        worker: str,
    ) -> bool:
        """Write the key's completion record (when the job has a key and ``records=`` a
        store) *before* the delete: a crash between the two leaves a message that is
        redelivered and skipped as completed. A failed write raises and settles nothing."""
        if not self._held.owns(delivery, lease):
            return False
        await self._keys.complete(job, record_ttl)
        held = self._held.take(delivery, lease)
        if held is None:
            return False
        ok = await self._connection.delete(held.receipt, self._queues.url)
        await self._locks.unlock(lease)
        self._bump("processed" if ok else "ack_refused")
        if job is not None:
            if ok:
                fields = finish.fields(worker, time.time())
                self._records.finish(job, finish.state, fields, finish.keep_for)
            else:
                self._records.requeued(job.id)
        return ok

    async def retry(
        self,
        delivery: Delivery,
        job: Job,
        run_at: float,
        lease: Lease | None,
        failure: Failure | None,
    ) -> bool:
        """Hide the message until ``run_at``, at most 12 h from its receive."""
        held = self._held.take(delivery, lease)
        if held is None:
            return False
        wanted = math.ceil(max(0.0, run_at - time.time()))
        budget = max(0, MAX_VISIBILITY - math.ceil(time.monotonic() - held.received) - 1)
        if wanted > budget:
            log.warning(
                "message %s: retry delay %ds capped at %ds (SQS allows 12 h from the receive)",
                delivery.id,
                wanted,
                budget,
            )
        seconds = min(wanted, budget)
        ok = await self._connection.set_visibility(held.receipt, seconds, self._queues.url)
        await self._locks.unlock(lease)
        self._bump("retried" if ok else "retry_refused")
        if ok:
            fields = failure_fields(failure) if failure is not None else {}
            self._records.retrying(job, time.time() + seconds, fields)
        else:
            self._records.requeued(job.id)
        return ok

    async def defer(self, delivery: Delivery, job: Job, run_at: float, lease: Lease | None) -> bool:
        """Hide the message until ``run_at`` (at most 12 h from its receive), as ``retry``
        does; its record reads delayed. SQS counts the next receive, and so the attempt."""
        held = self._held.take(delivery, lease)
        if held is None:
            return False
        budget = max(0, MAX_VISIBILITY - math.ceil(time.monotonic() - held.received) - 1)
        seconds = min(math.ceil(max(0.0, run_at - time.time())), budget)
        ok = await self._connection.set_visibility(held.receipt, seconds, self._queues.url)
        await self._locks.unlock(lease)
        self._bump("deferred" if ok else "defer_refused")
        if ok:
            self._records.deferred(job, time.time() + seconds)
        else:
            self._records.requeued(job.id)
        return ok

    async def dead_letter(
        self,
        delivery: Delivery,
        job: Job | None,
        failure: Failure,
        attempts: int,
        lease: Lease | None,
        keep_for: float,
    ) -> str | None:
        """Send to the DLQ (or drop with an error log, with ``dlq=none``), then delete; the
        DLQ message's id (the message's own with ``dlq=none``), None when refused."""
        held = self._held.take(delivery, lease)
        if held is None:
            return None
        entry_id = await self._dead_letters.send(delivery, job, failure, attempts)
        ok = await self._connection.delete(held.receipt, self._queues.url)
        await self._locks.unlock(lease)
        self._bump("dead")
        if job is not None:
            if ok:
                fields = failure_fields(failure)
                fields.update(finished_at=repr(time.time()), dlq_entry=entry_id)
                if failure.worker:
                    fields["worker"] = failure.worker
                self._records.finish(job, "dead", fields, keep_for)
            else:
                self._records.requeued(job.id)
        return entry_id if ok else None

    async def requeue(self, delivery: Delivery, lease: Lease | None, job: Job | None) -> bool:
        held = self._held.take(delivery, lease)
        if held is None:
            return False
        ok = await self._connection.set_visibility(held.receipt, 0, self._queues.url)
        await self._locks.unlock(lease)
        self._bump("requeued")
        if job is not None:
            self._records.requeued(job.id)
        return ok
