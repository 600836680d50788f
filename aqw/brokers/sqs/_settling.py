"""Settling messages (``MessageSettler``): each step stops tracking the message, settles it
on SQS (a delete, or a visibility change), frees the job's lease in the lock store and is
counted. The job's record (kept in the process) moves with the base's settle steps
(``Broker.ack`` and the others), and with a ``records=redis://`` store the final record of
a job read elsewhere is written there first (``StoreJobRecords``); a message taken but not
settled reads ``queued`` again here, since it comes back when its visibility runs out."""

from __future__ import annotations

import logging
import math
import time

from ...job import Job
from ...lease import Lease
from ..batching import BATCH_HEADER
from ..messages import Delivery, Failure, Finish
from ._batches import StoreCounts
from ._connection import Connection
from ._dead_letters import DeadLetterQueue
from ._held import HeldMessages
from ._keys import Keys
from ._leases import LockStore
from ._limits import MAX_VISIBILITY
from ._queues import Queues
from ._results import StoreJobRecords

log = logging.getLogger("aqw.sqs")


class MessageSettler:
    """SQSBroker's ``_ack``, ``_retry``, ``_defer``, ``_dead_letter`` and ``_give_back``. Each
    returns False (``dead_letter``: None), touching nothing, when another holder runs the
    job now; ``counts`` are what it did."""

    def __init__(
        self,
        connection: Connection,
        queues: Queues,
        held: HeldMessages,
        locks: LockStore,
        dead_letters: DeadLetterQueue,
        keys: Keys,
        records: StoreJobRecords,
        batches: StoreCounts | None = None,
    ) -> None:
        self._connection = connection
        self._queues = queues
        self._held = held
        self._locks = locks
        self._dead_letters = dead_letters
        self._keys = keys
        self._records = records
        #: With ``records=redis://``: a batch child's count, made before its delete.
        self._batches = batches
        self.counts: dict[str, int] = {}

    async def send_outbox(self) -> None:
        """Send the jobs the batch counts enqueued and no worker sent yet (at a start)."""
        if self._batches is not None:
            await self._batches.flush()

    async def _count(self, job: Job | None, state: str, result: str | None, keep: float) -> None:
        """Count a batch child (or a flow's step) in the store, before its message is
        deleted; nothing for a job of no batch."""
        if job is not None and self._batches is not None and BATCH_HEADER in job.headers:
            await self._batches.settled(job, state, result, keep)

    def _bump(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    async def ack(
        self,
        delivery: Delivery,
        job: Job | None,
        lease: Lease | None,
        finish: Finish,
        record_ttl: float,
    ) -> bool:
        """Write the key's completion record (when the job has a key and ``records=`` a
        store) *before* the delete: a crash between the two leaves a message that is
        redelivered and skipped as completed. A failed write raises and settles nothing."""
        if not self._held.owns(delivery, lease):
            return False
        await self._keys.complete(job, record_ttl)
        if job is not None and self._records.wants(job):  # its end, read elsewhere
            fields = finish.fields("", time.time())
            await self._records.put_final(job, finish.state, fields, finish.keep_for)
        await self._count(job, finish.state, finish.result, finish.keep_for)
        held = self._held.take(delivery, lease)
        if held is None:
            return False
        ok = await self._connection.delete(held.receipt, self._queues.url)
        await self._locks.unlock(lease)
        self._bump("processed" if ok else "ack_refused")
        if not ok and job is not None:
            self._records.given_back(job.id)
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
        if not ok:
            self._records.given_back(job.id)
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
        if not ok:
            self._records.given_back(job.id)
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
        DLQ message's id (the message's own with ``dlq=none``), None when refused. A batch
        child is counted dead first, while the message is still held."""
        if not self._held.owns(delivery, lease):
            return None
        if job is not None and self._records.wants(job):  # its end (the DLQ entry: here only)
            fields = Finish(failure=failure).fields("", time.time())
            await self._records.put_final(job, "dead", fields, keep_for)
        await self._count(job, "dead", None, keep_for)
        held = self._held.take(delivery, lease)
        if held is None:
            return None
        entry_id = await self._dead_letters.send(delivery, job, failure, attempts)
        ok = await self._connection.delete(held.receipt, self._queues.url)
        await self._locks.unlock(lease)
        self._bump("dead")
        if not ok and job is not None:
            self._records.given_back(job.id)
        return entry_id if ok else None

    async def give_back(self, delivery: Delivery, lease: Lease | None, job: Job | None) -> bool:
        held = self._held.take(delivery, lease)
        if held is None:
            return False
        ok = await self._connection.set_visibility(held.receipt, 0, self._queues.url)
        await self._locks.unlock(lease)
        self._bump("requeued")
        if not ok and job is not None:
            self._records.given_back(job.id)
        return ok
