"""Amazon SQS broker (aioboto3): long polling, batched receives, deletes and visibility changes,
the visibility timeout as the job lease, the queue's own RedrivePolicy and a dead-letter queue.

URL forms (options after ``?`` in both)::

    sqs://QUEUE_NAME?region=us-east-1&endpoint_url=http://127.0.0.1:4566&dlq=NAME
    sqs://https://sqs.eu-west-1.amazonaws.com/123456789012/jobs?dlq=jobs-dead

Options: ``region``, ``endpoint_url``, ``dlq`` (dead-letter queue name, or ``none`` to drop dead
jobs with an error log; default: the target of the queue's RedrivePolicy), ``wait`` (long-poll
seconds, 0-20, overriding the runtime's block), ``visibility`` (visibility timeout asked for on
receive; default: the queue's), ``task`` (the task that consumes plain-JSON bodies of other
producers), ``create=1`` (create missing queues; otherwise a missing queue is a ConfigError),
``locks`` (a ``redis://`` URL for real leases and fencing next to SQS), ``pool`` (HTTP
connections, default 50) and ``pollers`` (most concurrent ReceiveMessage calls, default 10).

How aqw's model maps onto SQS:

- **Lease = visibility.** ``job_lease_key(job)`` is the usual ``aqw:{queue}:lease:<job id>``.
  ``fetch`` reads each message's job id (the ``aqw-job-id`` attribute, else the body) and keeps
  ``lease key -> message id -> latest receipt handle``. ``renew`` is a ChangeMessageVisibility
  (batched with the renewals due at the same moment); a receipt SQS no longer accepts
  (ReceiptHandleIsInvalid, InvalidParameterValue, MessageNotInflight) refuses the renewal, so
  the Lease cancels the handler with LeaseLost. ``acquire`` makes no call unless the message's
  visibility would run out before the first renewal, and ``release`` only forgets the handle.
  The fencing token is the message's ApproximateReceiveCount: it grows with every delivery of
  one message but SQS gives no hard guarantee. For real fencing, and for ``ctx.lock()`` across
  processes, pass ``locks=redis://...``; without it resource locks are local to this process.
- **Attempts = receives.** ``retry()`` changes the visibility to the backoff delay instead of
  sending a new message (the body cannot change), so ApproximateReceiveCount grows and the
  queue's RedrivePolicy fires. ``fetch`` rewrites the envelope's ``attempt`` to
  ``max(attempt, ApproximateReceiveCount)``: every receive counts as an attempt, including one
  ended by a crash or a shutdown. A retry delay is capped at 12 h from the receive.
- **Delays.** ``schedule`` sends with DelaySeconds (<= 900 s). Longer delays are sent with
  DelaySeconds=900 and an ``aqw-not-before`` attribute; a message received before that time is
  not handed out: it is hidden again with a visibility change (<= 12 h, while the queue's redrive
  limit is not near) and, for the last stretch, re-sent as a fresh message (then deleted), so the
  job's first run starts at receive count 1. FIFO queues refuse per-message delays: ConfigError.
- **FIFO.** MessageGroupId is the job header ``aqw-group`` or else the task name;
  MessageDeduplicationId the idempotency key or the job id. SQS hands out several messages of
  one group in one receive, and aqw runs jobs concurrently, so on FIFO queues every
  ReceiveMessage asks for one message (concurrent calls still return other groups): a group
  then never has two messages in flight and runs in order, retries included.
- **Dead letters** go to the DLQ queue with the error in the ``aqw-failure`` attribute (JSON:
  type, message, traceback tail, attempts, worker, times), then the original is deleted (a
  failed delete can leave a copy in both). Listing peeks (receive with a 30 s visibility, then
  visibility 0): approximate, oldest first by SentTimestamp, at most 10,000 messages scanned.
  Replay sends back to the queue then deletes from the DLQ; delete receives and deletes the
  matching message ids. Messages the queue's RedrivePolicy moved show as
  ``MaxReceiveCountExceeded``.
- A fetch cancelled during a long poll gives whatever the poll still returns back at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aioboto3
from aiobotocore.config import AioConfig
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.exceptions import HTTPClientError

from ..errors import BrokerUnavailable, ConfigError
from ..job import Job
from ..lease import Lease, LeaseBackend
from .base import Broker, DeadJob, Delivery, Failure, QueueDepth

log = logging.getLogger("aqw.sqs")

MAX_BATCH = 10
MAX_WAIT = 20
MAX_DELAY = 900
MAX_VISIBILITY = 43_200
PEEK_VISIBILITY = 30
DLQ_SCAN_LIMIT = 10_000
NOT_BEFORE = "aqw-not-before"
FAILURE = "aqw-failure"
_SYSTEM_ATTRIBUTES = ["ApproximateReceiveCount", "SentTimestamp", "MessageGroupId"]
_OPTIONS = {"region", "endpoint_url", "dlq", "wait", "visibility", "task", "create", "locks",
            "pool", "pollers"}  # fmt: skip
#: Error codes meaning "this receipt handle no longer names a message we hold".
_GONE = {"ReceiptHandleIsInvalid", "InvalidParameterValue", "MessageNotInflight",
         "AWS.SimpleQueueService.MessageNotInflight", "InvalidReceiptHandle"}  # fmt: skip
_THROTTLED = {"ThrottlingException", "RequestThrottled", "Throttling", "ServiceUnavailable",
              "InternalError", "InternalFailure", "KMS.ThrottlingException",
              "AWS.SimpleQueueService.RequestThrottled"}  # fmt: skip
_MISSING = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}
_DEDUP_ID = re.compile(r"^[!-~]{1,128}$")
_AWS_HOST = re.compile(r"^(?:sqs\.([a-z0-9-]+)|([a-z0-9-]+)\.queue)\.amazonaws\.com")

Entry = dict[str, Any]


class SQSUnavailable(BrokerUnavailable, ConnectionError):
    """SQS could not be reached, or throttled the call: the runtime retries with backoff."""


def _code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, BotoConnectionError | HTTPClientError | asyncio.TimeoutError):
        return True
    response = getattr(exc, "response", None)
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) if response else 0
    return _code(exc) in _THROTTLED or int(status or 0) >= 500


async def _request(client: Any, op: str, **params: Any) -> dict[str, Any]:
    """One SQS call; unreachable or throttled becomes :class:`SQSUnavailable`."""
    try:
        reply: dict[str, Any] = await getattr(client, op)(**params)
    except Exception as exc:
        if _transient(exc):
            raise SQSUnavailable(f"SQS {op} failed: {exc}") from exc
        raise
    return reply


class _Batcher:
    """Entries submitted within ``linger`` seconds share one ``*Batch`` call (10 at most). Each
    caller awaits its own entry: True when done, False when SQS says the receipt handle is no
    longer valid. Entries failing for another reason are retried one by one a few times."""

    def __init__(
        self,
        batch: Callable[[list[Entry]], Awaitable[dict[str, Any]]],
        one: Callable[[Entry], Awaitable[Any]],
        linger: float,
        retries: int = 3,
    ) -> None:
        self._batch, self._one, self.linger, self.retries = batch, one, linger, retries
        self._queue: list[tuple[Entry, asyncio.Future[bool]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.calls = 0

    def submit(self, entry: Entry) -> asyncio.Future[bool]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._queue.append((entry, fut))
        if len(self._queue) >= MAX_BATCH:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.linger, self._flush)
        return fut

    async def drain(self) -> None:
        self._flush()
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._queue:
            chunk = self._queue[:MAX_BATCH]
            del self._queue[:MAX_BATCH]
            self._spawn(self._send(chunk))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, chunk: list[tuple[Entry, asyncio.Future[bool]]]) -> None:
        self.calls += 1
        try:
            reply = await self._batch([{**e, "Id": str(i)} for i, (e, _) in enumerate(chunk)])
        except BaseException as exc:  # also on cancellation: no caller may hang
            error = exc if isinstance(exc, Exception) else SQSUnavailable("batch call cancelled")
            for _, fut in chunk:
                if not fut.done():
                    fut.set_exception(error)
            if not isinstance(exc, Exception):
                raise
            return
        failed = {f["Id"]: f for f in reply.get("Failed", [])}
        for i, (entry, fut) in enumerate(chunk):
            failure = failed.get(str(i))
            if fut.done():
                continue
            if failure is None:
                fut.set_result(True)
            elif failure.get("Code") in _GONE:
                fut.set_result(False)
            else:
                self._spawn(self._retry_one(entry, fut, failure))

    async def _retry_one(
        self, entry: Entry, fut: asyncio.Future[bool], failure: dict[str, Any]
    ) -> None:
        error: Exception = SQSUnavailable(f"{failure.get('Code')}: {failure.get('Message')}")
        for attempt in range(self.retries):
            await asyncio.sleep(0.05 * 2**attempt)
            try:
                await self._one(entry)
            except Exception as exc:
                if _code(exc) in _GONE:
                    if not fut.done():
                        fut.set_result(False)
                    return
                error = exc
                continue
            if not fut.done():
                fut.set_result(True)
            return
        if not fut.done():
            fut.set_exception(error)


@dataclass(slots=True)
class _Held:
    """A message this process received and has not settled."""

    receipt: str
    key: str | None  # the job's lease key, None when the body is not a job
    count: int  # ApproximateReceiveCount
    received: float  # time.monotonic() at receive
    visible_until: float  # monotonic time its visibility runs out
    token: str | None = None  # the lease token of the holder running it


class _VisibilityLeases:
    """The LeaseBackend of an SQS queue: a job's lease is its message's visibility."""

    def __init__(self, broker: SQSBroker) -> None:
        self._broker = broker

    async def acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        return await self._broker._lease_acquire(key, token, ttl_ms)

    async def renew(self, key: str, token: str, ttl_ms: int) -> bool:
        return await self._broker._lease_renew(key, token, ttl_ms)

    async def release(self, key: str, token: str) -> bool:
        return await self._broker._lease_release(key, token)


class SQSBroker(Broker):
    """A queue on Amazon SQS (standard or FIFO). See the module docstring for the mapping."""

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
        self.dlq_url: str | None = None
        self.wait = wait
        self.visibility = visibility
        self.default_task = default_task
        self.create = create
        self.pool = pool
        self.pollers = pollers
        self.fifo = queue.endswith(".fifo")
        self.max_receives: int | None = None
        self._given_url = queue_url
        self._queue_visibility = 30
        self._lease_visibility: int | None = None
        self._dlq_fifo = False
        self._lock_url = lock_store if isinstance(lock_store, str) else None
        self._lock_store = None if isinstance(lock_store, str) else lock_store
        self._locks: LeaseBackend = self._lock_store or _local_locks()
        self._leases = _VisibilityLeases(self)
        self._lease_prefix = f"aqw:{{{queue}}}:lease:"
        self._client: Any = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._connecting: asyncio.Lock | None = None
        self._batchers: dict[tuple[str, str], _Batcher] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._held: dict[str, _Held] = {}
        self._keys: dict[str, str] = {}
        self._hot = False
        self._pruned = time.monotonic()
        self._stats: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"<SQSBroker queue={self.queue!r} fifo={self.fifo} dlq={self.dlq_name!r}>"

    @classmethod
    def from_url(cls, url: str, queue: str = "default") -> SQSBroker:
        """``sqs://NAME?opts`` or ``sqs://https://host/ACCOUNT/NAME?opts`` (see module doc)."""
        if not url.lower().startswith("sqs://"):
            raise ConfigError(f"not an sqs:// URL: {url!r}")
        rest, _, query = url[len("sqs://") :].partition("?")
        opts = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        unknown = sorted(set(opts) - _OPTIONS)
        if unknown:
            known = ", ".join(sorted(_OPTIONS))
            raise ConfigError(f"unknown sqs:// option(s) {', '.join(unknown)} (known: {known})")
        region, endpoint, queue_url = opts.get("region"), opts.get("endpoint_url"), None
        if rest.lower().startswith(("http://", "https://")):
            queue_url = rest
            parts = urlsplit(rest)
            name = parts.path.rstrip("/").rsplit("/", 1)[-1]
            aws = _AWS_HOST.match(parts.hostname or "")
            if aws:
                region = region or aws.group(1) or aws.group(2)
            else:
                endpoint = endpoint or f"{parts.scheme}://{parts.netloc}"
        else:
            name = rest.strip("/") or queue
        if not name:
            raise ConfigError(f"sqs:// URL names no queue: {url!r}")
        return cls(
            name,
            queue_url=queue_url,
            region=region,
            endpoint_url=endpoint,
            dlq=opts.get("dlq") or None,
            wait=_int_option(opts, "wait"),
            visibility=_int_option(opts, "visibility"),
            default_task=opts.get("task") or None,
            create=opts.get("create", "0").lower() in ("1", "true", "yes"),
            lock_store=opts.get("locks") or None,
            pool=_int_option(opts, "pool") or 50,
            pollers=_int_option(opts, "pollers") or 10,
        )

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
                from ..lease import RedisLeaseBackend
                from .redis import make_client

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

    def _receive_visibility(self) -> int | None:
        return self.visibility if self.visibility is not None else self._lease_visibility

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

    async def _ensure(self) -> Any:
        if self._client is None:
            await self.connect()
        return self._client

    async def _call(self, op: str, **params: Any) -> dict[str, Any]:
        return await _request(await self._ensure(), op, **params)

    def _batcher(self, kind: str, url: str) -> _Batcher:
        batcher = self._batchers.get((kind, url))
        if batcher is None:
            if kind == "delete":
                batcher = _Batcher(
                    lambda entries: self._call(
                        "delete_message_batch", QueueUrl=url, Entries=entries
                    ),
                    lambda e: self._call("delete_message", QueueUrl=url, **e),
                    linger=0.005,
                )
            else:
                batcher = _Batcher(
                    lambda entries: self._call(
                        "change_message_visibility_batch", QueueUrl=url, Entries=entries
                    ),
                    lambda e: self._call("change_message_visibility", QueueUrl=url, **e),
                    linger=0.001,
                )
            self._batchers[(kind, url)] = batcher
        return batcher

    async def _delete(self, receipt: str, url: str | None = None) -> bool:
        return await self._batcher("delete", url or self.queue_url).submit(
            {"ReceiptHandle": receipt}
        )

    async def _set_visibility(self, receipt: str, seconds: int, url: str | None = None) -> bool:
        entry = {"ReceiptHandle": receipt, "VisibilityTimeout": seconds}
        return await self._batcher("visibility", url or self.queue_url).submit(entry)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _bump(self, name: str) -> None:
        self._stats[name] = self._stats.get(name, 0) + 1

    # -- producing -------------------------------------------------------------------------

    async def publish(self, jobs: Sequence[Job]) -> None:
        await self._ensure()
        await self._send(self.queue_url, [self._entry(job) for job in jobs])

    async def schedule(self, jobs: Sequence[Job], run_at: float) -> None:
        await self._ensure()
        delay = run_at - time.time()
        if delay <= 0:
            await self.publish(jobs)
            return
        if self.fifo:
            raise ConfigError(
                f"SQS FIFO queue {self.queue!r} does not allow per-message delays: enqueue "
                "without delay=/at=, or set the queue's DelaySeconds attribute"
            )
        seconds = math.ceil(delay)
        if seconds <= MAX_DELAY:
            entries = [self._entry(job, seconds) for job in jobs]
        else:
            entries = [self._entry(job, MAX_DELAY, run_at) for job in jobs]
        await self._send(self.queue_url, entries)

    def _entry(self, job: Job, delay: int = 0, not_before: float | None = None) -> Entry:
        attrs = {"aqw-job-id": job.id, "aqw-task": job.task, "aqw-attempt": str(job.attempt)}
        for name in ("traceparent", "tracestate"):
            if job.headers.get(name):
                attrs[name] = job.headers[name]
        if not_before is not None:
            attrs[NOT_BEFORE] = repr(not_before)
        entry: Entry = {"MessageBody": job.encode().decode(), "MessageAttributes": _typed(attrs)}
        if delay:
            entry["DelaySeconds"] = delay
        if self.fifo:
            entry["MessageGroupId"] = job.headers.get("aqw-group") or job.task
            entry["MessageDeduplicationId"] = _dedup_id(job.key or job.id)
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
            await self._call("send_message", QueueUrl=url, **chunk[0])
            return
        entries = [{**entry, "Id": str(i)} for i, entry in enumerate(chunk)]
        reply = await self._call("send_message_batch", QueueUrl=url, Entries=entries)
        for failure in reply.get("Failed", []):
            entry = chunk[int(failure["Id"])]
            for attempt in range(3):
                await asyncio.sleep(0.05 * 2**attempt)
                try:
                    await self._call("send_message", QueueUrl=url, **entry)
                    break
                except SQSUnavailable:
                    if attempt == 2:
                        raise

    # -- consuming -------------------------------------------------------------------------

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
        data, job_id = self._prepare(str(msg.get("Body", "")), attrs, count, mid, system)
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

    def _prepare(
        self, body: str, attrs: dict[str, str], count: int, mid: str, system: dict[str, Any]
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
        if isinstance(value, dict) and "task" in value and ("v" in value or not self.default_task):
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
        if not self.default_task:
            return body.encode(), None
        headers = {k: attrs[k] for k in ("traceparent", "tracestate") if attrs.get(k)}
        sent = _int(system.get("SentTimestamp"), 0) / 1000 or time.time()
        job = Job(id=mid, task=self.default_task, payload=value, attempt=max(1, count),
                  enqueued_at=sent, headers=headers)  # fmt: skip
        return job.encode(), mid

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

    def _forget(self, mid: str) -> _Held | None:
        held = self._held.pop(mid, None)
        if held is not None and held.key is not None and self._keys.get(held.key) == mid:
            del self._keys[held.key]
        return held

    # -- leases: visibility ----------------------------------------------------------------

    def lease_backend(self) -> LeaseBackend:
        return self._leases

    async def keep_alive(self, delivery: Delivery) -> bool:
        return delivery.id in self._held

    def _job_held(self, key: str) -> tuple[str, _Held] | None:
        mid = self._keys.get(key)
        held = self._held.get(mid) if mid is not None else None
        return (mid, held) if mid is not None and held is not None else None

    async def _lease_acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        if not key.startswith(self._lease_prefix):
            return await self._locks.acquire(key, token, ttl_ms)
        found = self._job_held(key)
        if found is None or found[1].token not in (None, token):
            return None
        mid, held = found
        fence: int | None = held.count
        if self._lock_store is not None:
            fence = await self._lock_store.acquire(key, token, ttl_ms)
            if fence is None:
                return None
        held.token = token
        ttl = _seconds(ttl_ms)
        if held.visible_until - time.monotonic() < ttl / 3 + 1.0 and not await self._extend(
            held, ttl
        ):
            self._forget(mid)
            if self._lock_store is not None:
                await self._lock_store.release(key, token)
            return None
        return fence

    async def _lease_renew(self, key: str, token: str, ttl_ms: int) -> bool:
        if not key.startswith(self._lease_prefix):
            return await self._locks.renew(key, token, ttl_ms)
        found = self._job_held(key)
        if found is None or found[1].token != token:
            return False
        ok = await self._extend(found[1], _seconds(ttl_ms))
        if ok and self._lock_store is not None:
            ok = await self._lock_store.renew(key, token, ttl_ms)
        return ok

    async def _lease_release(self, key: str, token: str) -> bool:
        if not key.startswith(self._lease_prefix):
            return await self._locks.release(key, token)
        found = self._job_held(key)
        if found is not None and found[1].token == token:
            self._forget(found[0])  # the message comes back when its visibility runs out
        if self._lock_store is not None:
            await self._lock_store.release(key, token)
        return True

    async def _extend(self, held: _Held, seconds: int) -> bool:
        sent = time.monotonic()
        ok = await self._set_visibility(held.receipt, seconds)
        if ok:
            held.visible_until = sent + seconds
        return ok

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

    async def ack(self, delivery: Delivery, lease: Lease | None) -> bool:
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
        self, delivery: Delivery, failure: Failure, attempts: int, lease: Lease | None
    ) -> bool:
        held = self._take(delivery, lease)
        if held is None:
            return False
        if self.dlq_url is None:
            log.error("dropping message %s: no dead-letter queue (dlq=none): %s: %s",
                      delivery.id, failure.error_type, failure.error)  # fmt: skip
        else:
            await self._send_dead(delivery, failure, attempts)
        ok = await self._delete(held.receipt)
        await self._unlock(lease)
        self._bump("dead")
        return ok

    async def _send_dead(self, delivery: Delivery, failure: Failure, attempts: int) -> None:
        assert self.dlq_url is not None
        job = delivery.job
        doc = {
            "error_type": failure.error_type,
            "error": failure.error[:2000],
            "traceback": failure.traceback[-6000:],
            "attempts": attempts,
            "worker": failure.worker,
            "first_failed_at": failure.first_failed_at or failure.failed_at,
            "failed_at": failure.failed_at,
            "queue": self.queue,
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
            "QueueUrl": self.dlq_url,
            "MessageBody": delivery.data.decode("utf-8", "replace") or " ",
            "MessageAttributes": _typed(attrs),
        }
        if self._dlq_fifo:
            params["MessageGroupId"] = job.id if job is not None else delivery.id
            params["MessageDeduplicationId"] = _dedup_id(delivery.id)
        await self._call("send_message", **params)

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

    # -- dead-letter queue -----------------------------------------------------------------

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

    async def dlq_replay(self, entries: Sequence[tuple[str, Job]]) -> int:
        wanted = dict(entries)
        found = [m for m in await self._dlq_scan(set(wanted)) if m["MessageId"] in wanted]
        try:
            if found:
                await self.publish([wanted[m["MessageId"]] for m in found])
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
        if self.dlq_url is None:
            await self._ensure()
            if self.dlq_url is None:
                return []
        seen: dict[str, dict[str, Any]] = {}
        empty = 0
        while len(seen) < DLQ_SCAN_LIMIT and empty < 2:
            reply = await self._call(
                "receive_message",
                QueueUrl=self.dlq_url,
                MaxNumberOfMessages=MAX_BATCH,
                VisibilityTimeout=PEEK_VISIBILITY,
                WaitTimeSeconds=0,
                MessageAttributeNames=["All"],
                MessageSystemAttributeNames=_SYSTEM_ATTRIBUTES,
            )
            batch = reply.get("Messages", [])
            empty = 0 if batch else empty + 1
            seen.update((m["MessageId"], m) for m in batch)
            if want is not None and want <= seen.keys():
                break
        found = sorted(seen.values(), key=lambda m: (_sent(m), m["MessageId"]))
        others = found if release else [m for m in found if m["MessageId"] not in (want or ())]
        await self._dlq_release(others)
        return found

    async def _dlq_settle(self, messages: list[dict[str, Any]]) -> int:
        assert self.dlq_url is not None
        results = await asyncio.gather(
            *(self._delete(m["ReceiptHandle"], self.dlq_url) for m in messages)
        )
        for m in messages:
            m["_settled"] = True
        return sum(results)

    async def _dlq_release(self, messages: list[dict[str, Any]]) -> None:
        """Make peeked DLQ messages visible again (once)."""
        todo = [m for m in messages if not m.get("_settled")]
        for m in todo:
            m["_settled"] = True
        if self.dlq_url is not None and todo:
            await asyncio.gather(
                *(self._set_visibility(m["ReceiptHandle"], 0, self.dlq_url) for m in todo),
                return_exceptions=True,
            )

    def _dead_job(self, msg: dict[str, Any]) -> DeadJob:
        attrs = _string_attributes(msg)
        system = msg.get("Attributes", {})
        mid = str(msg["MessageId"])
        data, job_id = self._prepare(str(msg.get("Body", "")), attrs, 1, mid, system)
        doc: dict[str, Any] = {}
        with contextlib.suppress(ValueError, TypeError):
            loaded = json.loads(attrs.get(FAILURE, "{}"))
            doc = loaded if isinstance(loaded, dict) else {}
        sent = _sent(msg) / 1000
        task = attrs.get("aqw-task") or _task_of(data)
        if not doc:
            doc = {
                "error_type": "MaxReceiveCountExceeded",
                "error": f"moved here by the RedrivePolicy of SQS queue {self.queue!r} after "
                f"{self.max_receives or '?'} receives",
                "attempts": self.max_receives or 0,
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
            attempts=_int(doc.get("attempts"), 0),
            first_failed_at=_float(doc.get("first_failed_at")),
            last_failed_at=_float(doc.get("failed_at")),
            worker=str(doc.get("worker", "")),
        )


# -- helpers ---------------------------------------------------------------------------------


def _local_locks() -> LeaseBackend:
    from .memory import MemoryLeaseBackend

    return MemoryLeaseBackend()


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _int_option(opts: dict[str, str], name: str) -> int | None:
    if not opts.get(name):
        return None
    try:
        return int(opts[name])
    except ValueError:
        raise ConfigError(f"sqs:// option {name}= must be an integer, got {opts[name]!r}") from None


def _seconds(ttl_ms: int) -> int:
    return min(MAX_VISIBILITY, max(1, math.ceil(ttl_ms / 1000)))


def _sent(msg: dict[str, Any]) -> int:
    return _int(msg.get("Attributes", {}).get("SentTimestamp"), 0)


def _typed(attrs: dict[str, str]) -> dict[str, dict[str, str]]:
    return {k: {"DataType": "String", "StringValue": v} for k, v in attrs.items() if v}


def _string_attributes(msg: dict[str, Any]) -> dict[str, str]:
    return {
        k: str(v["StringValue"])
        for k, v in msg.get("MessageAttributes", {}).items()
        if "StringValue" in v
    }


def _raw_attributes(msg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    keep = ("DataType", "StringValue", "BinaryValue")
    return {
        k: {f: v[f] for f in keep if f in v} for k, v in msg.get("MessageAttributes", {}).items()
    }


def _dedup_id(value: str) -> str:
    return value if _DEDUP_ID.match(value) else hashlib.sha256(value.encode()).hexdigest()


def _task_of(data: bytes) -> str:
    with contextlib.suppress(ValueError):
        value = json.loads(data)
        if isinstance(value, dict) and isinstance(value.get("task"), str):
            return str(value["task"])
    return ""
