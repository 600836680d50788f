"""Redis Streams broker: a consumer group per queue, manual acks, XAUTOCLAIM recovery.

Layout (all keys share the ``{queue}`` hash tag): ``aqw:{q}:stream`` holds unfinished jobs
(entries are deleted when settled, so it stays bounded), ``aqw:{q}:delayed`` (ZSET by due
time), ``aqw:{q}:dlq`` (capped stream), ``aqw:{q}:fence`` (fencing counter),
``aqw:{q}:lease:<job id>`` and ``aqw:{q}:stats``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

from redis.asyncio import Redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError, ResponseError, TimeoutError
from redis.retry import Retry

from .. import _scripts
from .._batch import CommandBatcher
from .._keys import GROUP, QueueKeys
from ..job import Job
from ..lease import Lease, LeaseBackend, RedisLeaseBackend
from .base import Broker, DeadJob, Delivery, Failure, QueueDepth

#: Longest BLOCK of one XREADGROUP; short enough to notice a stop quickly.
MAX_BLOCK = 2.0


def make_client(url: str, **overrides: Any) -> Redis:
    """A client with bounded retries and timeouts, so a lost connection is retried a few
    times with backoff instead of hanging or failing at the first reset."""
    options: dict[str, Any] = {
        "socket_connect_timeout": 5.0,
        "socket_timeout": MAX_BLOCK + 10.0,
        "socket_keepalive": True,
        "health_check_interval": 30,
        "retry": Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), 3),
        "retry_on_error": [ConnectionError, TimeoutError, ConnectionResetError],
    }
    options.update(overrides)
    return Redis.from_url(url, **options)


def split_queue(url: str, default: str) -> tuple[str, str]:
    """Take ``?queue=name`` off a redis URL: (url without it, queue name)."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    queue = query.pop("queue", [default])[-1]
    rest = "&".join(f"{k}={v}" for k, vs in query.items() for v in vs)
    return urlunsplit(parts._replace(query=rest)), queue


class RedisBroker(Broker):
    """A queue on Redis Streams.

    Args:
        client: a ``redis.asyncio.Redis`` (or cluster) client, or a ``redis://`` URL.
        queue: the queue name.
        dlq_limit: most entries the dead-letter stream keeps; older ones are trimmed and
            counted in ``stats()['dlq_trimmed']``.
    """

    system = "redis"

    def __init__(self, client: Redis | str, queue: str = "default", *, dlq_limit: int = 100_000):
        super().__init__(queue)
        self.url = client if isinstance(client, str) else None
        self.client: Redis = make_client(client) if isinstance(client, str) else client
        self._owns_client = isinstance(client, str)
        self.keys = QueueKeys(queue)
        self.dlq_limit = dlq_limit
        self.batcher = CommandBatcher(self.client)
        self._leases = RedisLeaseBackend(self.batcher, fence_key=self.keys.fence)
        self._ack = _scripts.load("ack")
        self._retry = _scripts.load("retry")
        self._dead = _scripts.load("dead_letter")
        self._requeue = _scripts.load("requeue")
        self._keep_alive = _scripts.load("keep_alive")
        self._promote = _scripts.load("promote")
        self._replay = _scripts.load("dlq_replay")
        self._unique = _scripts.load("enqueue_unique")
        self._group_ready = False

    async def connect(self) -> None:
        await self.client.ping()
        await self._ensure_group()

    async def _ensure_group(self) -> None:
        try:
            await self.client.xgroup_create(self.keys.stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    async def close(self) -> None:
        if self._owns_client:
            await self.client.aclose()

    # -- producing -------------------------------------------------------------------------

    async def publish(self, jobs: Sequence[Job]) -> None:
        if len(jobs) == 1:
            await self.batcher.execute("XADD", self.keys.stream, "*", "j", jobs[0].encode())
            return
        pipe = self.client.pipeline(transaction=False)
        for job in jobs:
            pipe.execute_command("XADD", self.keys.stream, "*", "j", job.encode())
        await pipe.execute()

    async def publish_unique(self, job: Job, ttl: float, run_at: float | None) -> tuple[str, bool]:
        assert job.key is not None
        due = int(run_at * 1000) if run_at is not None else 0
        job_id, duplicate = await self.batcher.script(
            self._unique,
            [
                self.keys.idempotency(job.key),
                self.keys.stream,
                self.keys.delayed,
                self.keys.done(job.key),
            ],
            [job.id, max(1, int(ttl * 1000)), job.encode(), due],
        )
        return _text(job_id), bool(duplicate)

    async def schedule(self, jobs: Sequence[Job], run_at: float) -> None:
        due = int(run_at * 1000)
        mapping = {job.encode(): due for job in jobs}
        await self.client.zadd(self.keys.delayed, mapping)

    # -- consuming -------------------------------------------------------------------------

    async def fetch(self, count: int, block: float) -> list[Delivery]:
        block_ms = max(1, int(min(block, MAX_BLOCK) * 1000))
        try:
            reply: Any = await self.client.xreadgroup(
                GROUP, self.consumer, {self.keys.stream: ">"}, count=count, block=block_ms
            )
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            await self._ensure_group()  # the stream was deleted under us: recreate, read again
            return []
        if not reply:
            return []
        return [_delivery(entry_id, fields) for entry_id, fields in reply[0][1] if fields]

    async def reclaim(self, idle: float, count: int) -> list[Delivery]:
        reply: Any = await self.client.xautoclaim(
            self.keys.stream, GROUP, self.consumer, int(idle * 1000), "0-0", count=count
        )
        entries = [(i, f) for i, f in reply[1] if f]
        if not entries:
            return []
        pipe = self.client.pipeline(transaction=False)
        for entry_id, _ in entries:
            pipe.xpending_range(self.keys.stream, GROUP, entry_id, entry_id, 1)
        counts = await pipe.execute()
        out = []
        for (entry_id, fields), pending in zip(entries, counts, strict=True):
            delivered = int(pending[0]["times_delivered"]) if pending else 1
            out.append(_delivery(entry_id, fields, delivered))
        return out

    async def give_back_unstarted(self, running: set[str]) -> int:
        if not self.consumer:
            return 0
        pending: Any = await self.client.xpending_range(
            self.keys.stream, GROUP, "-", "+", 1000, consumername=self.consumer
        )
        given = 0
        for entry in pending:
            entry_id = _text(entry["message_id"])
            if entry_id not in running and await self.requeue(Delivery(entry_id, b""), None):
                given += 1
        return given

    async def promote_due(self) -> float | None:
        moved, next_due = await self.batcher.script(
            self._promote, [self.keys.delayed, self.keys.stream], [int(time.time() * 1000), 500]
        )
        if int(moved) >= 500:
            return 0.0
        if int(next_due) < 0:
            return None
        return max(0.0, int(next_due) / 1000 - time.time())

    def lease_backend(self) -> LeaseBackend:
        return self._leases

    def job_lease_key(self, job: Job) -> str:
        return self.keys.lease(job.id)

    async def keep_alive(self, delivery: Delivery) -> bool:
        ok = await self.batcher.script(
            self._keep_alive, [self.keys.stream], [GROUP, self.consumer, delivery.id]
        )
        return bool(ok)

    # -- settling --------------------------------------------------------------------------

    def _lease_args(self, delivery: Delivery, lease: Lease | None) -> tuple[str, str]:
        if lease is None:
            return f"{self.keys.tag}:lease:-", ""
        return lease.key, lease.token

    async def ack(self, delivery: Delivery, lease: Lease | None) -> bool:
        key, token = self._lease_args(delivery, lease)
        job = delivery.job
        if job is not None and job.key is not None and self.completion_ttl > 0:
            record, ttl_ms = self.keys.done(job.key), max(1, int(self.completion_ttl * 1000))
        else:
            record, ttl_ms = self.keys.done(""), 0
        ok = await self.batcher.merged(
            self._ack,
            (self.keys.stream, self.keys.stats),
            (GROUP,),
            (key, record),
            (delivery.id, token, ttl_ms, job.id if job else ""),
        )
        return bool(ok)

    async def retry(self, delivery: Delivery, job: Job, run_at: float, lease: Lease | None) -> bool:
        key, token = self._lease_args(delivery, lease)
        ok = await self.batcher.script(
            self._retry,
            [self.keys.stream, self.keys.delayed, key, self.keys.stats],
            [GROUP, token, delivery.id, int(run_at * 1000), job.encode()],
        )
        return bool(ok)

    async def dead_letter(
        self, delivery: Delivery, failure: Failure, attempts: int, lease: Lease | None
    ) -> bool:
        key, token = self._lease_args(delivery, lease)
        job = delivery.job
        fields: list[Any] = [
            "j", delivery.data,
            "task", job.task if job else "",
            "job_id", job.id if job else "",
            "error_type", failure.error_type,
            "error", failure.error,
            "tb", failure.traceback,
            "attempts", attempts,
            "first", repr(failure.first_failed_at or failure.failed_at),
            "last", repr(failure.failed_at),
            "worker", failure.worker,
        ]  # fmt: skip
        ok = await self.batcher.script(
            self._dead,
            [self.keys.stream, self.keys.dlq, key, self.keys.stats],
            [GROUP, token, delivery.id, self.dlq_limit, *fields],
        )
        return ok is not None

    async def requeue(self, delivery: Delivery, lease: Lease | None) -> bool:
        key, token = self._lease_args(delivery, lease)
        ok = await self._requeue(
            self.client, [self.keys.stream, key], [GROUP, self.consumer, token, delivery.id]
        )
        return ok is not None

    async def is_completed(self, job: Job) -> bool:
        if job.key is None:
            return False
        return bool(await self.batcher.execute("EXISTS", self.keys.done(job.key)))

    async def set_job_state(self, job_id: str, state: dict[str, str], ttl: float) -> None:
        key = self.keys.job_state(job_id)
        fields = [x for pair in state.items() for x in pair]
        started = float(state.get("started_at", 0) or time.time())
        await asyncio.gather(
            self.batcher.execute("HSET", key, *fields),
            self.batcher.execute("PEXPIRE", key, max(1, int(ttl * 1000))),
            self.batcher.execute("ZADD", self.keys.running, started, job_id),
        )

    async def clear_job_state(self, job_id: str) -> None:
        await asyncio.gather(
            self.batcher.execute("DEL", self.keys.job_state(job_id)),
            self.batcher.execute("ZREM", self.keys.running, job_id),
        )

    async def job_state(self, job_id: str) -> dict[str, str] | None:
        raw: Any = await self.client.hgetall(self.keys.job_state(job_id))
        return {_text(k): _text(v) for k, v in raw.items()} or None

    async def job_states(self, limit: int = 1000) -> list[dict[str, str]]:
        ids: Any = await self.client.zrange(self.keys.running, 0, limit - 1)
        if not ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(self.keys.job_state(_text(job_id)))
        states: Any = await pipe.execute()
        gone = [job_id for job_id, raw in zip(ids, states, strict=True) if not raw]
        if gone:  # their worker died: the state expired, the index entry stayed
            await self.client.zrem(self.keys.running, *gone)
        return [{_text(k): _text(v) for k, v in raw.items()} for raw in states if raw]

    async def publish_heartbeat(self, worker: str, data: dict[str, Any], ttl: float) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self.keys.worker(worker), json.dumps(data), px=max(1, int(ttl * 1000)))
        pipe.sadd(self.keys.workers, worker)
        await pipe.execute()

    async def heartbeats(self) -> list[dict[str, Any]]:
        names: Any = await self.client.smembers(self.keys.workers)
        if not names:
            return []
        ordered = sorted(_text(n) for n in names)
        values: Any = await self.client.mget([self.keys.worker(n) for n in ordered])
        gone = [n for n, v in zip(ordered, values, strict=True) if v is None]
        if gone:
            await self.client.srem(self.keys.workers, *gone)
        return [json.loads(v) for v in values if v is not None]

    async def remove_heartbeat(self, worker: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(self.keys.worker(worker))
        pipe.srem(self.keys.workers, worker)
        await pipe.execute()

    # -- inspection ------------------------------------------------------------------------

    async def depth(self) -> QueueDepth:
        pipe = self.client.pipeline(transaction=False)
        pipe.xlen(self.keys.stream)
        pipe.zcard(self.keys.delayed)
        pipe.xlen(self.keys.dlq)
        length, delayed, dead = await pipe.execute()
        try:
            pending = await self.client.xpending(self.keys.stream, GROUP)
            in_flight = int(pending["pending"])
        except ResponseError:
            in_flight = 0
        return QueueDepth(max(0, length - in_flight), in_flight, delayed, dead)

    async def stats(self) -> dict[str, int]:
        raw: Any = await self.client.hgetall(self.keys.stats)
        return {_text(k): int(v) for k, v in raw.items()}

    # -- dead-letter queue -----------------------------------------------------------------

    async def dlq_list(self, count: int = 100, after: str | None = None) -> list[DeadJob]:
        start = f"({after}" if after else "-"
        entries: Any = await self.client.xrange(self.keys.dlq, start, "+", count=count)
        return [_dead_job(entry_id, fields) for entry_id, fields in entries]

    async def dlq_get(self, entry_id: str) -> DeadJob | None:
        try:
            entries: Any = await self.client.xrange(self.keys.dlq, entry_id, entry_id)
        except ResponseError:
            return None
        return _dead_job(*entries[0]) if entries else None

    async def dlq_replay(self, entries: Sequence[tuple[str, Job]]) -> int:
        argv: list[Any] = []
        for entry_id, job in entries:
            argv += [entry_id, job.encode()]
        if not argv:
            return 0
        return int(await self._replay(self.client, [self.keys.dlq, self.keys.stream], argv))

    async def dlq_delete(self, entry_ids: Sequence[str]) -> int:
        if not entry_ids:
            return 0
        return int(await self.client.xdel(self.keys.dlq, *entry_ids))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _delivery(entry_id: Any, fields: dict[Any, Any], delivered: int = 1) -> Delivery:
    data = fields.get(b"j")
    if data is None:  # an entry written by someone else: keep it all, so the DLQ shows it
        data = repr({_text(k): v for k, v in fields.items()}).encode()
    return Delivery(id=_text(entry_id), data=data, delivery_count=delivered)


def _dead_job(entry_id: Any, fields: dict[Any, Any]) -> DeadJob:
    f = {_text(k): v for k, v in fields.items()}
    return DeadJob(
        id=_text(entry_id),
        data=f.get("j", b""),
        task=_text(f.get("task", b"")),
        job_id=_text(f.get("job_id", b"")),
        error_type=_text(f.get("error_type", b"")),
        error=_text(f.get("error", b"")),
        traceback=_text(f.get("tb", b"")),
        attempts=int(f.get("attempts", 0)),
        first_failed_at=float(f.get("first", 0) or 0),
        last_failed_at=float(f.get("last", 0) or 0),
        worker=_text(f.get("worker", b"")),
    )
