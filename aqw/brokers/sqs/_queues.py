"""The queue and its dead-letter queue as SQS has them (``Queues``): their URLs, FIFO or not,
the queue's visibility timeout and RedrivePolicy, found (or, with ``create=1``, created) on
connect; and how much work they hold."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ...errors import ConfigError
from ..base import QueueDepth
from ._connection import Connection
from ._errors import MISSING, error_code, request
from ._messages import as_int


class Queues:
    """The queue ``name`` (at ``url`` when given, else looked up by name) and its DLQ: ``dlq``
    names it, ``none`` means none, and by default it is the target of the queue's
    RedrivePolicy. ``visibility`` is the VisibilityTimeout of a queue this creates."""

    def __init__(
        self,
        connection: Connection,
        name: str,
        *,
        url: str | None,
        dlq: str | None,
        visibility: int | None,
        create: bool,
    ) -> None:
        self._connection = connection
        self.name = name
        self.url = url or ""
        self.fifo = name.endswith(".fifo")
        self.visibility_timeout = 30  # the queue's VisibilityTimeout, read on connect
        self.max_receives: int | None = None  # the RedrivePolicy's maxReceiveCount
        self.dlq_name = dlq
        self.dlq_url: str | None = None  # None: no dead-letter queue (dlq=none), or not yet
        self.dlq_fifo = False
        self.create = create
        self._given_url = url
        self._create_visibility = visibility

    async def resolve(self, client: Any) -> None:
        """Find the queues with ``client`` (a new one, not yet the connection's)."""
        if not self._given_url:
            attrs = {"FifoQueue": "true"} if self.fifo else {}
            if self._create_visibility is not None:
                attrs["VisibilityTimeout"] = str(self._create_visibility)
            self.url = await self._url_of(client, self.name, attrs)
        try:
            reply = await request(
                client, "get_queue_attributes", QueueUrl=self.url, AttributeNames=["All"]
            )
        except Exception as exc:
            if error_code(exc) in MISSING:
                raise ConfigError(f"SQS queue {self.url!r} does not exist") from None
            raise
        attrs = reply.get("Attributes", {})
        self.fifo = attrs.get("FifoQueue") == "true" or self.fifo
        self.visibility_timeout = int(attrs.get("VisibilityTimeout", 30))
        target: str | None = None
        owner: str | None = None
        if attrs.get("RedrivePolicy"):
            policy = json.loads(attrs["RedrivePolicy"])
            self.max_receives = int(policy.get("maxReceiveCount", 0)) or None
            arn = str(policy.get("deadLetterTargetArn", "")).split(":")
            target, owner = (arn[-1], arn[-2]) if len(arn) >= 6 else (None, None)
        name = self.dlq_name or target
        if name and name.lower() != "none":
            self.dlq_fifo = name.endswith(".fifo")
            created = {"FifoQueue": "true"} if self.dlq_fifo else {}
            self.dlq_url = await self._url_of(
                client, name, created, owner if not self.dlq_name else None
            )

    async def _url_of(
        self, client: Any, name: str, attributes: dict[str, str], owner: str | None = None
    ) -> str:
        extra = {"QueueOwnerAWSAccountId": owner} if owner else {}
        try:
            reply = await request(client, "get_queue_url", QueueName=name, **extra)
        except Exception as exc:
            if error_code(exc) not in MISSING:
                raise
            if not self.create:
                where = self._connection.endpoint_url or (
                    f"region {self._connection.region or '(default)'}"
                )
                raise ConfigError(
                    f"SQS queue {name!r} does not exist at {where}: create it, or add create=1 "
                    "to the sqs:// URL"
                ) from None
            reply = await request(client, "create_queue", QueueName=name, Attributes=attributes)
        return str(reply["QueueUrl"])

    def require_dlq(self) -> None:
        """A consumer needs somewhere to put dead jobs (or an explicit ``dlq=none``)."""
        if self.dlq_url is None and (self.dlq_name or "").lower() != "none":
            raise ConfigError(
                f"SQS queue {self.name!r} has no dead-letter queue: add dlq=NAME to the URL, "
                "give the queue a RedrivePolicy, or pass dlq=none to drop dead jobs"
            )

    async def depth(self) -> QueueDepth:
        names = [
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ]
        call = self._connection.call
        await self._connection.ensure()
        calls = [call("get_queue_attributes", QueueUrl=self.url, AttributeNames=names)]
        if self.dlq_url is not None:
            calls.append(call("get_queue_attributes", QueueUrl=self.dlq_url, AttributeNames=names))
        replies = await asyncio.gather(*calls)
        main = replies[0].get("Attributes", {})
        dead = replies[1].get("Attributes", {}) if len(replies) > 1 else {}
        return QueueDepth(
            waiting=as_int(main.get(names[0]), 0),
            in_flight=as_int(main.get(names[1]), 0),
            delayed=as_int(main.get(names[2]), 0),
            dead=sum(as_int(dead.get(n), 0) for n in names),
        )
