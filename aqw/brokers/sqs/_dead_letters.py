"""The dead-letter queue: sending a dead job there with its failure, and listing, reading,
replaying and deleting its messages by peeking (receive, then visibility 0)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from ...job import Job
from ..base import DeadJob, Delivery, Failure
from ._connection import Connection
from ._limits import DLQ_SCAN_LIMIT, MAX_BATCH, PEEK_VISIBILITY
from ._messages import (
    FAILURE,
    SYSTEM_ATTRIBUTES,
    Entry,
    as_float,
    as_int,
    dedup_id,
    prepare,
    sent_timestamp,
    string_attributes,
    task_of,
    typed_attributes,
)
from ._producing import Producer
from ._queues import Queues

log = logging.getLogger("aqw.sqs")


class DeadLetterQueue:
    """SQSBroker's ``dlq_*`` operations, and the DLQ half of ``dead_letter``. Replays are
    published with ``producer``; plain-JSON bodies read as jobs of ``default_task``."""

    def __init__(
        self,
        connection: Connection,
        queues: Queues,
        producer: Producer,
        *,
        default_task: str | None,
    ) -> None:
        self._connection = connection
        self._queues = queues
        self._producer = producer
        self._default_task = default_task

    async def send(
        self, delivery: Delivery, job: Job | None, failure: Failure, attempts: int
    ) -> str:
        """Send a dead job to the DLQ with its failure and return the DLQ message's id;
        without a DLQ (``dlq=none``) log it and return the message's own id."""
        dlq_url = self._queues.dlq_url
        if dlq_url is None:
            log.error(
                "dropping message %s: no dead-letter queue (dlq=none): %s: %s",
                delivery.id,
                failure.error_type,
                failure.error,
            )
            return delivery.id
        doc = {
            "error_type": failure.error_type,
            "error": failure.error[:2000],
            "traceback": failure.traceback[-6000:],
            "attempts": attempts,
            "worker": failure.worker,
            "first_failed_at": failure.first_failed_at or failure.failed_at,
            "failed_at": failure.failed_at,
            "queue": self._queues.name,
            "message_id": delivery.id,
            "receive_count": delivery.delivery_count,
        }
        attrs = {"aqw-error-type": failure.error_type, FAILURE: json.dumps(doc)}
        if job is not None:
            attrs.update({"aqw-job-id": job.id, "aqw-task": job.task})
        for name in ("traceparent", "tracestate"):
            if delivery.attributes.get(name):
                attrs[name] = delivery.attributes[name]
        params: Entry = {
            "QueueUrl": dlq_url,
            "MessageBody": delivery.data.decode("utf-8", "replace") or " ",
            "MessageAttributes": typed_attributes(attrs),
        }
        if self._queues.dlq_fifo:
            params["MessageGroupId"] = job.id if job is not None else delivery.id
            params["MessageDeduplicationId"] = dedup_id(delivery.id)
        reply = await self._connection.call("send_message", **params)
        return str(reply.get("MessageId") or delivery.id)

    async def dlq_list(self, count: int = 100, after: str | None = None) -> list[DeadJob]:
        entries = [self._dead_job(m) for m in await self._dlq_scan(None, release=True)]
        if after is not None:
            ids = [e.id for e in entries]
            entries = entries[ids.index(after) + 1 :] if after in ids else []
        return entries[:count]

    async def dlq_get(self, entry_id: str) -> DeadJob | None:
        for msg in await self._dlq_scan({entry_id}, release=True):
            if msg["MessageId"] == entry_id:
                return self._dead_job(msg)
        return None

    async def dlq_replay(
        self,
        entries: Sequence[tuple[str, Job]],
        sent: Callable[[Sequence[Job]], None] | None = None,
    ) -> int:
        """Send the entries found back to the queue (``sent`` is told which jobs went), then
        delete them from the DLQ."""
        wanted = dict(entries)
        found = [m for m in await self._dlq_scan(set(wanted)) if m["MessageId"] in wanted]
        try:
            if found:
                jobs = [wanted[m["MessageId"]] for m in found]
                await self._producer.publish(jobs)
                if sent is not None:
                    sent(jobs)
                await self._dlq_settle(found)
        finally:
            await self._dlq_release(found)
        return len(found)

    async def dlq_delete(self, entry_ids: Sequence[str]) -> int:
        wanted = set(entry_ids)
        found = [m for m in await self._dlq_scan(wanted) if m["MessageId"] in wanted]
        try:
            deleted = await self._dlq_settle(found)
        finally:
            await self._dlq_release(found)
        return deleted

    async def _dlq_scan(self, want: set[str] | None, release: bool = False) -> list[dict[str, Any]]:
        """Receive DLQ messages, each hidden for 30 s, until ``want`` are all seen or the queue
        looks empty (two empty short polls); oldest first. Those not in ``want`` are given back
        (visibility 0); with ``release`` all are."""
        if self._queues.dlq_url is None:
            await self._connection.ensure()
            if self._queues.dlq_url is None:
                return []
        seen: dict[str, dict[str, Any]] = {}
        empty = 0
        while len(seen) < DLQ_SCAN_LIMIT and empty < 2:
            reply = await self._connection.call(
                "receive_message",
                QueueUrl=self._queues.dlq_url,
                MaxNumberOfMessages=MAX_BATCH,
                VisibilityTimeout=PEEK_VISIBILITY,
                WaitTimeSeconds=0,
                MessageAttributeNames=["All"],
                MessageSystemAttributeNames=SYSTEM_ATTRIBUTES,
            )
            batch = reply.get("Messages", [])
            empty = 0 if batch else empty + 1
            seen.update((m["MessageId"], m) for m in batch)
            if want is not None and want <= seen.keys():
                break
        found = sorted(seen.values(), key=lambda m: (sent_timestamp(m), m["MessageId"]))
        others = found if release else [m for m in found if m["MessageId"] not in (want or ())]
        await self._dlq_release(others)
        return found

    async def _dlq_settle(self, messages: list[dict[str, Any]]) -> int:
        dlq_url = self._queues.dlq_url
        assert dlq_url is not None
        results = await asyncio.gather(
            *(self._connection.delete(m["ReceiptHandle"], dlq_url) for m in messages)
        )
        for m in messages:
            m["_settled"] = True
        return sum(results)

    async def _dlq_release(self, messages: list[dict[str, Any]]) -> None:
        """Make peeked DLQ messages visible again (once)."""
        todo = [m for m in messages if not m.get("_settled")]
        for m in todo:
            m["_settled"] = True
        dlq_url = self._queues.dlq_url
        if dlq_url is not None and todo:
            await asyncio.gather(
                *(self._connection.set_visibility(m["ReceiptHandle"], 0, dlq_url) for m in todo),
                return_exceptions=True,
            )

    def _dead_job(self, msg: dict[str, Any]) -> DeadJob:
        attrs = string_attributes(msg)
        system = msg.get("Attributes", {})
        mid = str(msg["MessageId"])
        body = str(msg.get("Body", ""))
        data, job_id = prepare(body, attrs, 1, mid, system, self._default_task)
        doc: dict[str, Any] = {}
        with contextlib.suppress(ValueError, TypeError):
            loaded = json.loads(attrs.get(FAILURE, "{}"))
            doc = loaded if isinstance(loaded, dict) else {}
        sent = sent_timestamp(msg) / 1000
        task = attrs.get("aqw-task") or task_of(data)
        if not doc:
            queue, receives = self._queues.name, self._queues.max_receives
            doc = {
                "error_type": "MaxReceiveCountExceeded",
                "error": f"moved here by the RedrivePolicy of SQS queue {queue!r} after "
                f"{receives or '?'} receives",
                "attempts": receives or 0,
                "first_failed_at": sent,
                "failed_at": sent,
            }
        return DeadJob(
            id=mid,
            data=data,
            task=task,
            job_id=job_id or "",
            error_type=str(doc.get("error_type", "")),
            error=str(doc.get("error", "")),
            traceback=str(doc.get("traceback", "")),
            attempts=as_int(doc.get("attempts"), 0),
            first_failed_at=as_float(doc.get("first_failed_at")),
            last_failed_at=as_float(doc.get("failed_at")),
            worker=str(doc.get("worker", "")),
        )
