"""SQSBroker: construction, connecting (queue URLs, RedrivePolicy, DLQ, lock store), settling
deliveries and inspection; producing, consuming, leases and the dead-letter queue come from the
parts it is made of. How aqw maps onto SQS: the package docstring (``aqw.brokers.sqs``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import aioboto3
from aiobotocore.config import AioConfig

from ..._redis.lease import RedisLeaseBackend
from ...errors import ConfigError
from ...job import Job
from ...lease import Lease, LeaseBackend
from ..base import Delivery, Failure, QueueDepth
from ..redis import make_client
from ._base import _Held, _local_locks
from ._dead_letters import _DeadLetters
from ._delivery import _Consumer
from ._errors import _MISSING, _code, _request
from ._leases import _Leasing, _VisibilityLeases
from ._limits import MAX_VISIBILITY, MAX_WAIT, _seconds
from ._messages import _int
from ._options import _parse_url
from ._producing import _Producer

log = logging.getLogger("aqw.sqs")


class SQSBroker(_Producer, _Consumer, _Leasing, _DeadLetters):
    """A queue on Amazon SQS (standard or FIFO). See the package docstring for the mapping."""

    system = "aws_sqs"

    def __init__(
        self,
        queue: str,
        *,
        queue_url: str | None = None,
        region: str | None = None,
        endpoint_url: str | None = None,
        dlq: str | None = None,
        wait: int | None = None,
        visibility: int | None = None,
        default_task: str | None = None,
        create: bool = False,
        lock_store: LeaseBackend | str | None = None,
        pool: int = 50,
        pollers: int = 10,
    ) -> None:
        super().__init__(queue)
        if wait is not None and not 0 <= wait <= MAX_WAIT:
            raise ConfigError(f"sqs wait must be 0-{MAX_WAIT} seconds, got {wait!r}")
        if visibility is not None and not 0 <= visibility <= MAX_VISIBILITY:
            raise ConfigError(f"sqs visibility must be 0-{MAX_VISIBILITY} s, got {visibility!r}")
        if pool < 1 or pollers < 1:
            raise ConfigError(f"sqs pool and pollers must be >= 1, got {pool!r}, {pollers!r}")
        self.queue_url = queue_url or ""
        self.region = region
        self.endpoint_url = endpoint_url
        self.dlq_name = dlq
        self.dlq_url = None
        self.wait = wait
        self.visibility = visibility
        self.default_task = default_task
        self.create = create
        self.pool = pool
        self.pollers = pollers
        self.fifo = queue.endswith(".fifo")
        self.max_receives = None
        self._given_url = queue_url
        self._queue_visibility = 30
        self._lease_visibility = None
        self._dlq_fifo = False
        self._lock_url = lock_store if isinstance(lock_store, str) else None
        self._lock_store = None if isinstance(lock_store, str) else lock_store
        self._locks = self._lock_store or _local_locks()
        self._leases = _VisibilityLeases(self)
        self._lease_prefix = f"aqw:{{{queue}}}:lease:"
        self._client = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._connecting: asyncio.Lock | None = None
        self._batchers = {}
        self._background = set()
        self._held = {}
        self._keys = {}
        self._hot = False
        self._pruned = time.monotonic()
        self._stats: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"<SQSBroker queue={self.queue!r} fifo={self.fifo} dlq={self.dlq_name!r}>"

    @classmethod
    def from_url(cls, url: str, queue: str = "default") -> SQSBroker:
        """``sqs://NAME?opts`` or ``sqs://https://host/ACCOUNT/NAME?opts`` (see package doc)."""
        name, settings = _parse_url(url, queue)
        return cls(name, **settings)

    # -- lifecycle -------------------------------------------------------------------------

    async def connect(self) -> None:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._client is not None:
                return
            stack = contextlib.AsyncExitStack()
            config = AioConfig(
                max_pool_connections=self.pool,
                connect_timeout=5,
                read_timeout=MAX_WAIT + 10,
                retries={"max_attempts": 3, "mode": "standard"},
            )
            client = await stack.enter_async_context(
                aioboto3.Session().client(
                    "sqs", region_name=self.region, endpoint_url=self.endpoint_url, config=config
                )
            )
            try:
                await self._resolve(client)
            except BaseException:
                await stack.aclose()
                raise
            if self._lock_url is not None and self._lock_store is None:
                lock_client = make_client(self._lock_url)
                stack.push_async_callback(lock_client.aclose)
                self._lock_store = self._locks = RedisLeaseBackend(lock_client)
            self._batchers = {}
            self._client, self._stack = client, stack

    async def _resolve(self, client: Any) -> None:
        if not self._given_url:
            attrs = {"FifoQueue": "true"} if self.fifo else {}
            if self.visibility is not None:
                attrs["VisibilityTimeout"] = str(self.visibility)
            self.queue_url = await self._url_of(client, self.queue, attrs)
        try:
            reply = await _request(
                client, "get_queue_attributes", QueueUrl=self.queue_url, AttributeNames=["All"]
            )
        except Exception as exc:
            if _code(exc) in _MISSING:
                raise ConfigError(f"SQS queue {self.queue_url!r} does not exist") from None
            raise
        attrs = reply.get("Attributes", {})
        self.fifo = attrs.get("FifoQueue") == "true" or self.fifo
        self._queue_visibility = int(attrs.get("VisibilityTimeout", 30))
        target: str | None = None
        owner: str | None = None
        if attrs.get("RedrivePolicy"):
            policy = json.loads(attrs["RedrivePolicy"])
            self.max_receives = int(policy.get("maxReceiveCount", 0)) or None
            arn = str(policy.get("deadLetterTargetArn", "")).split(":")
            target, owner = (arn[-1], arn[-2]) if len(arn) >= 6 else (None, None)
        name = self.dlq_name or target
        if name and name.lower() != "none":
            self._dlq_fifo = name.endswith(".fifo")
            created = {"FifoQueue": "true"} if self._dlq_fifo else {}
            self.dlq_url = await self._url_of(
                client, name, created, owner if not self.dlq_name else None
            )

    async def _url_of(
        self, client: Any, name: str, attributes: dict[str, str], owner: str | None = None
    ) -> str:
        extra = {"QueueOwnerAWSAccountId": owner} if owner else {}
        try:
            reply = await _request(client, "get_queue_url", QueueName=name, **extra)
        except Exception as exc:
            if _code(exc) not in _MISSING:
                raise
            if not self.create:
                where = self.endpoint_url or f"region {self.region or '(default)'}"
                raise ConfigError(
                    f"SQS queue {name!r} does not exist at {where}: create it, or add create=1 "
                    "to the sqs:// URL"
                ) from None
            reply = await _request(client, "create_queue", QueueName=name, Attributes=attributes)
        return str(reply["QueueUrl"])

    async def start_consuming(self, consumer: str) -> None:
        await super().start_consuming(consumer)
        await self._ensure()
        if self.dlq_url is None and (self.dlq_name or "").lower() != "none":
            raise ConfigError(
                f"SQS queue {self.queue!r} has no dead-letter queue: add dlq=NAME to the URL, "
                "give the queue a RedrivePolicy, or pass dlq=none to drop dead jobs"
            )

    def expect_lease_ttl(self, seconds: float) -> None:
        """The longest job lease the runtime will take: received messages then start with that
        visibility (unless ``visibility=`` is set), so no lease needs an extension at acquire.
        A hint: without it the acquire extends a visibility that is too short."""
        self._lease_visibility = _seconds(math.ceil(seconds * 1000))

    async def reclaim(
        self, count: int, lease_ttl: Callable[[Job | None], float], min_idle: float
    ) -> list[Delivery]:
        """Nothing to do: an unsettled message becomes visible again by itself when its
        visibility timeout (the job's lease) runs out, and is then received anew."""
        return []

    async def close(self) -> None:
        for batcher in list(self._batchers.values()):
            await batcher.drain()
        if self._background:
            _, pending = await asyncio.wait(set(self._background), timeout=MAX_WAIT + 5)
            for task in pending:
                task.cancel()
        if self._stack is not None:
            await self._stack.aclose()
        self._client, self._stack, self._batchers = None, None, {}
        if self._lock_url is not None:
            self._lock_store = None
            self._locks = _local_locks()

    def _bump(self, name: str) -> None:
        self._stats[name] = self._stats.get(name, 0) + 1

    # -- settling --------------------------------------------------------------------------

    def _take(self, delivery: Delivery, lease: Lease | None) -> _Held | None:
        """Stop tracking ``delivery``; its receipt, or None when another holder runs its job."""
        held = self._held.get(delivery.id)
        if held is not None and lease is not None and held.token not in (None, lease.token):
            return None
        self._forget(delivery.id)
        if held is None:
            now = time.monotonic()
            held = _Held(str(delivery.receipt), None, delivery.delivery_count, now, now)
        return held

    async def _unlock(self, lease: Lease | None) -> None:
        if lease is not None and self._lock_store is not None:
            with contextlib.suppress(Exception):
                await self._lock_store.release(lease.key, lease.token)

    async def ack(
        self, delivery: Delivery, job: Job | None, lease: Lease | None, record_ttl: float = 0.0
    ) -> bool:
        held = self._take(delivery, lease)
        if held is None:
            return False
        ok = await self._delete(held.receipt)
        await self._unlock(lease)
        self._bump("processed" if ok else "ack_refused")
        return ok

    async def retry(self, delivery: Delivery, job: Job, run_at: float, lease: Lease | None) -> bool:
        """Hide the message for the backoff delay; the next receive is the next attempt (the
        body, and so ``job``, cannot change on SQS)."""
        held = self._take(delivery, lease)
        if held is None:
            return False
        wanted = math.ceil(max(0.0, run_at - time.time()))
        budget = max(0, MAX_VISIBILITY - math.ceil(time.monotonic() - held.received) - 1)
        if wanted > budget:
            log.warning("message %s: retry delay %ds capped at %ds (SQS allows 12 h from the "
                        "receive)", delivery.id, wanted, budget)  # fmt: skip
        ok = await self._set_visibility(held.receipt, min(wanted, budget))
        await self._unlock(lease)
        self._bump("retried" if ok else "retry_refused")
        return ok

    async def dead_letter(
        self,
        delivery: Delivery,
        job: Job | None,
        failure: Failure,
        attempts: int,
        lease: Lease | None,
    ) -> bool:
        held = self._take(delivery, lease)
        if held is None:
            return False
        if self.dlq_url is None:
            log.error("dropping message %s: no dead-letter queue (dlq=none): %s: %s",
                      delivery.id, failure.error_type, failure.error)  # fmt: skip
        else:
            await self._send_dead(delivery, job, failure, attempts)
        ok = await self._delete(held.receipt)
        await self._unlock(lease)
        self._bump("dead")
        return ok

    async def requeue(self, delivery: Delivery, lease: Lease | None) -> bool:
        held = self._take(delivery, lease)
        if held is None:
            return False
        ok = await self._set_visibility(held.receipt, 0)
        await self._unlock(lease)
        self._bump("requeued")
        return ok

    # -- inspection ------------------------------------------------------------------------

    async def depth(self) -> QueueDepth:
        """Approximate counts from GetQueueAttributes. Messages hidden by a retry or a
        not-yet-due delay count as in flight."""
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                 "ApproximateNumberOfMessagesDelayed"]  # fmt: skip
        await self._ensure()
        calls = [self._call("get_queue_attributes", QueueUrl=self.queue_url, AttributeNames=names)]
        if self.dlq_url is not None:
            calls.append(
                self._call("get_queue_attributes", QueueUrl=self.dlq_url, AttributeNames=names)
            )
        replies = await asyncio.gather(*calls)
        main = replies[0].get("Attributes", {})
        dead = replies[1].get("Attributes", {}) if len(replies) > 1 else {}
        return QueueDepth(
            waiting=_int(main.get(names[0]), 0),
            in_flight=_int(main.get(names[1]), 0),
            delayed=_int(main.get(names[2]), 0),
            dead=sum(_int(dead.get(n), 0) for n in names),
        )

    async def stats(self) -> dict[str, int]:
        """Counters of this broker instance (SQS keeps none per queue)."""
        return dict(self._stats)
