"""Receiving (``Consumer``): (concurrent) long polls, what a message becomes (the job id, the
``attempt`` rewritten to the receive count, plain JSON wrapped for ``default_task``), not-yet-due
messages hidden again, and the visibility received messages start with."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Coroutine
from typing import Any

from ..base import Delivery
from ._connection import Connection
from ._held import Held, HeldMessages
from ._limits import MAX_BATCH, MAX_DELAY, MAX_VISIBILITY, MAX_WAIT, visibility_seconds
from ._messages import (
    NOT_BEFORE,
    SYSTEM_ATTRIBUTES,
    as_float,
    as_int,
    prepare,
    raw_attributes,
    string_attributes,
)
from ._queues import Queues

log = logging.getLogger("aqw.sqs")

#: A received message and the monotonic time its receive call was sent.
Received = tuple[float, dict[str, Any]]


class Consumer:
    """SQSBroker's ``fetch``: received messages go into ``held``. ``wait`` (long-poll seconds)
    overrides the runtime's block; ``visibility`` (asked on receive) overrides the lease TTL
    the runtime announced, and without either a message has the queue's own."""

    def __init__(
        self,
        connection: Connection,
        queues: Queues,
        held: HeldMessages,
        *,
        wait: int | None,
        pollers: int,
        visibility: int | None,
        default_task: str | None,
    ) -> None:
        self._connection = connection
        self._queues = queues
        self._held = held
        self.wait = wait
        self.pollers = pollers
        self.visibility = visibility
        self.default_task = default_task
        self._lease_visibility: int | None = None  # from expect_lease_ttl
        self._hot = False  # the last fetch came back full: poll without waiting first

    def expect_lease_ttl(self, seconds: float) -> None:
        self._lease_visibility = visibility_seconds(math.ceil(seconds * 1000))

    def _receive_visibility(self) -> int | None:
        return self.visibility if self.visibility is not None else self._lease_visibility

    async def fetch(self, count: int, block: float) -> list[Delivery]:
        await self._connection.ensure()
        if count <= 0:
            return []
        self._held.prune()
        wait = self.wait if self.wait is not None else max(0, min(MAX_WAIT, round(block)))
        per_call = 1 if self._queues.fifo else MAX_BATCH
        first = min(count, per_call)
        messages: list[Received] = []
        if self._hot:
            messages = await self._receive_many(count, per_call, 0)
        if not messages:
            messages = await self._receive_many(first, per_call, wait)
            if len(messages) >= first and count > first:
                messages += await self._receive_many(count - len(messages), per_call, 0)
        self._hot = len(messages) >= first
        out: list[Delivery] = []
        postponed: list[Coroutine[Any, Any, None]] = []
        for sent, msg in messages:
            delivery = self._delivery(msg, sent, postponed)
            if delivery is not None:
                out.append(delivery)
        if postponed:
            for result in await asyncio.gather(*postponed, return_exceptions=True):
                if isinstance(result, BaseException):
                    log.warning("could not postpone a not-yet-due message: %r", result)
        return out

    async def _receive_many(self, n: int, per_call: int, wait: int) -> list[Received]:
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
            self._connection.spawn(self._give_back_received(gathered))
            raise
        messages: list[Received] = []
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

    async def _receive(self, size: int, wait: int) -> list[Received]:
        """The messages of one receive, each with the call's send time (``Received``)."""
        params: dict[str, Any] = {
            "QueueUrl": self._queues.url,
            "MaxNumberOfMessages": size,
            "WaitTimeSeconds": wait,
            "MessageAttributeNames": ["All"],
            "MessageSystemAttributeNames": SYSTEM_ATTRIBUTES,
        }
        visibility = self._receive_visibility()
        if visibility is not None:
            params["VisibilityTimeout"] = visibility
        sent = time.monotonic()
        reply = await self._connection.call("receive_message", **params)
        return [(sent, msg) for msg in reply.get("Messages", [])]

    async def _give_back_received(self, gathered: asyncio.Future[list[Any]]) -> None:
        """A fetch was cancelled mid-poll: hand back what the poll still brings, at once."""
        with contextlib.suppress(Exception):
            results = await gathered
            receipts = [m["ReceiptHandle"] for r in results if isinstance(r, list) for _, m in r]
            url = self._queues.url
            await asyncio.gather(
                *(self._connection.set_visibility(r, 0, url) for r in receipts),
                return_exceptions=True,
            )

    def _delivery(
        self, msg: dict[str, Any], sent: float, postponed: list[Coroutine[Any, Any, None]]
    ) -> Delivery | None:
        attrs = string_attributes(msg)
        system = msg.get("Attributes", {})
        count = as_int(system.get("ApproximateReceiveCount"), 1)
        mid = str(msg["MessageId"])
        if NOT_BEFORE in attrs and not self._queues.fifo:
            remaining = as_float(attrs[NOT_BEFORE]) - time.time()
            if remaining > 0.05:
                postponed.append(self._postpone(msg, remaining, count))
                return None
        body = str(msg.get("Body", ""))
        data, job_id = prepare(body, attrs, count, mid, system, self.default_task)
        now = time.monotonic()
        visibility = self._receive_visibility()
        if visibility is None:
            visibility = self._queues.visibility_timeout
        key = self._held.lease_key(job_id) if job_id else None
        # Hidden until at least the receive's send plus its visibility: timed at the reply,
        # a pause between the two would make the message look hidden for longer than it is.
        held = Held(str(msg["ReceiptHandle"]), key, count, now, sent + visibility)
        self._held.add(mid, held)
        return Delivery(
            id=mid, data=data, delivery_count=count, receipt=held.receipt, attributes=attrs
        )

    async def _postpone(self, msg: dict[str, Any], remaining: float, count: int) -> None:
        """Hide a not-yet-due message again: by visibility while far off (and the redrive limit
        is not near), then as a fresh message so the job starts at receive count 1."""
        receipt = str(msg["ReceiptHandle"])
        url = self._queues.url
        max_receives = self._queues.max_receives
        far = remaining > MAX_DELAY + 60
        if far and (max_receives is None or count + 1 < max_receives):
            hide = min(int(remaining) - MAX_DELAY, MAX_VISIBILITY)
            await self._connection.set_visibility(receipt, hide, url)
            return
        group = msg.get("Attributes", {}).get("MessageGroupId")
        await self._connection.call(
            "send_message",
            QueueUrl=url,
            MessageBody=msg["Body"],
            MessageAttributes=raw_attributes(msg),
            DelaySeconds=min(MAX_DELAY, max(1, math.ceil(remaining))),
            **({"MessageGroupId": group} if group else {}),  # a fair queue's tenant
        )
        await self._connection.delete(receipt, url)
