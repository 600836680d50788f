"""Sending jobs: SendMessage(Batch) entries, DelaySeconds and not-before for long delays, the
message group (FIFO order, fair queues) and FIFO deduplication ids."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Sequence

from ...errors import ConfigError
from ...job import Job
from ._connection import Connection
from ._errors import SQSUnavailable
from ._limits import MAX_BATCH, MAX_DELAY
from ._messages import NOT_BEFORE, Entry, dedup_id, typed_attributes
from ._queues import Queues


class Producer:
    """SQSBroker's ``publish`` and ``schedule``: SendMessage(Batch) calls to the queue."""

    def __init__(self, connection: Connection, queues: Queues) -> None:
        self._connection = connection
        self._queues = queues

    async def publish(self, jobs: Sequence[Job]) -> None:
        self.refuse_priorities(jobs)
        await self._connection.ensure()
        await self._send(self._queues.url, [self.entry(job) for job in jobs])

    async def schedule(self, jobs: Sequence[Job], run_at: float) -> None:
        self.refuse_priorities(jobs)
        await self._connection.ensure()
        delay = run_at - time.time()
        if delay <= 0:
            await self.publish(jobs)
            return
        if self._queues.fifo:
            raise ConfigError(
                f"SQS FIFO queue {self._queues.name!r} does not allow per-message delays: enqueue "
                "without delay=/at=, or set the queue's DelaySeconds attribute"
            )
        seconds = math.ceil(delay)
        if seconds <= MAX_DELAY:
            entries = [self.entry(job, seconds) for job in jobs]
        else:
            entries = [self.entry(job, MAX_DELAY, run_at) for job in jobs]
        await self._send(self._queues.url, entries)

    def refuse_priorities(self, jobs: Sequence[Job]) -> None:
        """A ``ConfigError`` for a job with a priority level: SQS hands messages out in no
        order of ours, so levels live in separate queues instead."""
        level = next((job.priority for job in jobs if job.priority), 0)
        if level:
            raise ConfigError(
                f"enqueue: priority={level}: SQS has no message priorities; use one queue per "
                f"level (e.g. {self._queues.name}-high) and run a worker on several queues "
                "(aqw worker --queues, or app.worker(queues=[...]), highest first)"
            )

    def entry(self, job: Job, delay: int = 0, not_before: float | None = None) -> Entry:
        """The SendMessage fields of ``job``: due after ``delay`` seconds, and not handed out
        before ``not_before`` (seconds since the epoch) when given."""
        attrs = {"aqw-job-id": job.id, "aqw-task": job.task, "aqw-attempt": str(job.attempt)}
        for name in ("traceparent", "tracestate"):
            if job.headers.get(name):
                attrs[name] = job.headers[name]
        if not_before is not None:
            attrs[NOT_BEFORE] = repr(not_before)
        entry: Entry = {
            "MessageBody": job.encode().decode(),
            "MessageAttributes": typed_attributes(attrs),
        }
        if delay:
            entry["DelaySeconds"] = delay
        group = job.headers.get("aqw-group")
        if self._queues.fifo:
            entry["MessageGroupId"] = group or job.task
            # The key or job id alone: under DeduplicationScope=queue, one key in any group.
            entry["MessageDeduplicationId"] = dedup_id(job.key or job.id)
        elif group:  # a fair queue's tenant; sent only when given (compatible servers)
            entry["MessageGroupId"] = group
        return entry

    async def _send(self, url: str, entries: list[Entry]) -> None:
        """SendMessageBatch in chunks of 10 (and < 240 KiB), sent concurrently. Not atomic:
        SQS has no transactions, so a failure can leave earlier chunks sent."""
        chunks: list[list[Entry]] = []
        size = 0
        for entry in entries:
            n = len(entry["MessageBody"]) + len(json.dumps(entry.get("MessageAttributes", {})))
            if not chunks or len(chunks[-1]) >= MAX_BATCH or size + n > 240_000:
                chunks.append([])
                size = 0
            chunks[-1].append(entry)
            size += n
        await asyncio.gather(*(self._send_chunk(url, chunk) for chunk in chunks))

    async def _send_chunk(self, url: str, chunk: list[Entry]) -> None:
        if len(chunk) == 1:
            await self._connection.call("send_message", QueueUrl=url, **chunk[0])
            return
        entries = [{**entry, "Id": str(i)} for i, entry in enumerate(chunk)]
        reply = await self._connection.call("send_message_batch", QueueUrl=url, Entries=entries)
        for failure in reply.get("Failed", []):
            entry = chunk[int(failure["Id"])]
            for attempt in range(3):
                await asyncio.sleep(0.05 * 2**attempt)
                try:
                    await self._connection.call("send_message", QueueUrl=url, **entry)
                    break
                except SQSUnavailable:
                    if attempt == 2:
                        raise
