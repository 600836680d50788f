"""Receiving: (concurrent) long polls, what a message becomes (the job id, the ``attempt``
rewritten to the receive count, plain JSON wrapped for ``default_task``), not-yet-due messages
hidden again, and the bookkeeping of held messages."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Coroutine
from typing import Any

from ...job import Job
from ..base import Delivery
from ._base import _Held, _SQSBase
from ._limits import MAX_BATCH, MAX_DELAY, MAX_VISIBILITY, MAX_WAIT
from ._messages import (
    _SYSTEM_ATTRIBUTES,
    NOT_BEFORE,
    _float,
    _int,
    _raw_attributes,
    _string_attributes,
)

log = logging.getLogger("aqw.sqs")


class _Consumer(_SQSBase):
    """SQSBroker's ``fetch``."""

    wait: int | None
    pollers: int
    _queue_visibility: int
    _hot: bool  # the last fetch came back full: poll without waiting first
    _pruned: float  # monotonic time of the last _prune

    async def fetch(self, count: int, block: float) -> list[Delivery]:
        """Up to ``count`` messages. One long poll when the queue looked idle; when a batch came
        back full (a backlog), up to ``pollers`` ReceiveMessage calls run at once, so a fetch of
        100 takes one round trip. FIFO queues ask one message per call (see module doc)."""
        await self._ensure()
        if count <= 0:
            return []
        self._prune()
        wait = self.wait if self.wait is not None else max(0, min(MAX_WAIT, round(block)))
        per_call = 1 if self.fifo else MAX_BATCH
        first = min(count, per_call)
        messages: list[dict[str, Any]] = []
        if self._hot:
            messages = await self._receive_many(count, per_call, 0)
        if not messages:
            messages = await self._receive_many(first, per_call, wait)
            if len(messages) >= first and count > first:
                messages += await self._receive_many(count - len(messages), per_call, 0)
        self._hot = len(messages) >= first
        out: list[Delivery] = []
        postponed: list[Coroutine[Any, Any, None]] = []
        for msg in messages:
            delivery = self._delivery(msg, postponed)
            if delivery is not None:
                out.append(delivery)
        if postponed:
            for result in await asyncio.gather(*postponed, return_exceptions=True):
                if isinstance(result, BaseException):
                    log.warning("could not postpone a not-yet-due message: %r", result)
        return out

    async def _receive_many(self, n: int, per_call: int, wait: int) -> list[dict[str, Any]]:
        sizes: list[int] = []
        while n > 0 and len(sizes) < self.pollers:
            sizes.append(min(per_call, n))
            n -= sizes[-1]
        gathered = asyncio.gather(
            *(self._receive(size, wait) for size in sizes), return_exceptions=True
        )
        try:
            results = await asyncio.shield(gathered)
        except asyncio.CancelledError:
            self._spawn(self._give_back_received(gathered))
            raise
        messages: list[dict[str, Any]] = []
        errors: list[BaseException] = []
        for result in results:
            if isinstance(result, BaseException):
                errors.append(result)
            else:
                messages.extend(result)
        if errors and not messages:
            raise errors[0]
        if errors:
            log.warning("%d of %d receive calls failed: %r", len(errors), len(sizes), errors[0])
        return messages

    async def _receive(self, size: int, wait: int) -> list[dict[str, Any]]:
        params: dict[str, Any] = {
            "QueueUrl": self.queue_url,
            "MaxNumberOfMessages": size,
            "WaitTimeSeconds": wait,
            "MessageAttributeNames": ["All"],
            "MessageSystemAttributeNames": _SYSTEM_ATTRIBUTES,
        }
        visibility = self._receive_visibility()
        if visibility is not None:
            params["VisibilityTimeout"] = visibility
        reply = await self._call("receive_message", **params)
        return list(reply.get("Messages", []))

    async def _give_back_received(self, gathered: asyncio.Future[list[Any]]) -> None:
        """A fetch was cancelled mid-poll: hand back what the poll still brings, at once."""
        with contextlib.suppress(Exception):
            results = await gathered
            receipts = [m["ReceiptHandle"] for r in results if isinstance(r, list) for m in r]
            await asyncio.gather(
                *(self._set_visibility(r, 0) for r in receipts), return_exceptions=True
            )

    def _delivery(
        self, msg: dict[str, Any], postponed: list[Coroutine[Any, Any, None]]
    ) -> Delivery | None:
        attrs = _string_attributes(msg)
        system = msg.get("Attributes", {})
        count = _int(system.get("ApproximateReceiveCount"), 1)
        mid = str(msg["MessageId"])
        if NOT_BEFORE in attrs and not self.fifo:
            remaining = _float(attrs[NOT_BEFORE]) - time.time()
            if remaining > 0.05:
                postponed.append(self._postpone(msg, remaining, count))
                return None
        body = str(msg.get("Body", ""))
        data, job_id = _prepare(body, attrs, count, mid, system, self.default_task)
        now = time.monotonic()
        visibility = self._receive_visibility()
        if visibility is None:
            visibility = self._queue_visibility
        key = self._lease_prefix + job_id if job_id else None
        held = _Held(str(msg["ReceiptHandle"]), key, count, now, now + visibility)
        before = self._held.get(mid)
        if before is not None:  # redelivered while we still run it: the holder keeps it
            held.token = before.token
        self._held[mid] = held
        if key is not None:
            owner = self._held.get(self._keys.get(key, ""))
            if owner is None or owner is held or owner.token is None:
                self._keys[key] = mid
        return Delivery(
            id=mid, data=data, delivery_count=count, receipt=held.receipt, attributes=attrs
        )

    async def _postpone(self, msg: dict[str, Any], remaining: float, count: int) -> None:
        """Hide a not-yet-due message again: by visibility while far off (and the redrive limit
        is not near), then as a fresh message so the job starts at receive count 1."""
        receipt = str(msg["ReceiptHandle"])
        far = remaining > MAX_DELAY + 60
        if far and (self.max_receives is None or count + 1 < self.max_receives):
            await self._set_visibility(receipt, min(int(remaining) - MAX_DELAY, MAX_VISIBILITY))
            return
        await self._call(
            "send_message",
            QueueUrl=self.queue_url,
            MessageBody=msg["Body"],
            MessageAttributes=_raw_attributes(msg),
            DelaySeconds=min(MAX_DELAY, max(1, math.ceil(remaining))),
        )
        await self._delete(receipt)

    def _prune(self) -> None:
        """Forget received messages nobody ran (refused leases, buffers) once long invisible."""
        now = time.monotonic()
        if now - self._pruned < 30:
            return
        self._pruned = now
        for mid, held in list(self._held.items()):
            if held.token is None and held.visible_until < now - 60:
                self._forget(mid)


def _prepare(
    body: str,
    attrs: dict[str, str],
    count: int,
    mid: str,
    system: dict[str, Any],
    default_task: str | None,
) -> tuple[bytes, str | None]:
    """The bytes handed to the runtime and the job id (None: not a job). An aqw envelope gets
    ``attempt = max(attempt, receive count)``; plain JSON is wrapped for ``default_task``."""
    job_id = attrs.get("aqw-job-id")
    if job_id and count <= _int(attrs.get("aqw-attempt"), 1):
        return body.encode(), job_id
    try:
        value = json.loads(body)
    except ValueError:
        return body.encode(), None
    if isinstance(value, dict) and "task" in value and ("v" in value or not default_task):
        changed = False
        if "id" not in value:
            value["id"], changed = mid, True
        attempt = value.get("attempt", 1)
        if isinstance(attempt, int) and count > attempt:
            value["attempt"], changed = count, True
        ident = value["id"] if isinstance(value["id"], str) and value["id"] else None
        if changed:
            return json.dumps(value, separators=(",", ":")).encode(), ident
        return body.encode(), ident
    if not default_task:
        return body.encode(), None
    headers = {k: attrs[k] for k in ("traceparent", "tracestate") if attrs.get(k)}
    sent = _int(system.get("SentTimestamp"), 0) / 1000 or time.time()
    job = Job(id=mid, task=default_task, payload=value, attempt=max(1, count),
              enqueued_at=sent, headers=headers)  # fmt: skip
    return job.encode(), mid
