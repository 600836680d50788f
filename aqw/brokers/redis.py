"""Redis Streams broker: a consumer group per queue, manual acks, recovery per job's lease.

Layout (all keys share the ``{queue}`` hash tag): ``aqw:{q}:stream`` holds unfinished jobs
(entries are deleted when settled, so it stays bounded), ``aqw:{q}:delayed`` (ZSET by due
time), ``aqw:{q}:dlq`` (capped stream), ``aqw:{q}:fence`` (fencing counter),
``aqw:{q}:lease:<job id>`` and ``aqw:{q}:stats``.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from redis.asyncio import Redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError, ResponseError, TimeoutError
from redis.retry import Retry

from .._damage import (
    DamagedDeadJob,
    check_job_state,
    damaged_heartbeat,
    heartbeat_damage,
    parse_json,
    shown,
    to_float,
    to_int,
)
from .._redis import scripts as _scripts
from .._redis.batch import CommandBatcher
from .._redis.keys import GROUP, QueueKeys
from .._redis.lease import RedisLeaseBackend
from ..job import Job
from ..lease import Lease, LeaseBackend
from .base import Broker, DeadJob, Delivery, Failure, QueueDepth

#: Longest BLOCK of one XREADGROUP; short enough to notice a stop quickly.
MAX_BLOCK = 2.0

#: One reclaim looks at up to ``max(RECLAIM_SCAN_MIN, count * RECLAIM_SCAN_FACTOR)`` idle
#: pending entries.
RECLAIM_SCAN_MIN = 16
RECLAIM_SCAN_FACTOR = 4


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
    """Take ``?queue=name`` off a redis URL: (url without it, queue name).

    The other query options are decoded and percent-encoded again, in their order (blank
    ones kept), so redis-py reads the values written: ``%2B``, ``%26`` and ``%20`` give
    ``+``, ``&`` and a space, and a bare ``+`` is a plus sign (``ssl_ca_certs=/a+b/ca.pem``),
    not a space as in an HTML form. The rest of the URL is kept as written (``urlunsplit``
    would turn ``unix:///path`` into ``unix:/path``)."""
    head, hash_, fragment = url.partition("#")
    base, _, query = head.partition("?")
    pairs = parse_qsl(query.replace("+", "%2B"), keep_blank_values=True)
    queues = [value for name, value in pairs if name == "queue"]
    rest = urlencode([(k, v) for k, v in pairs if k != "queue"], safe="/", quote_via=quote)
    plain = base + ("?" + rest if rest else "") + hash_ + fragment
    return plain, queues[-1] if queues else default


class RedisBroker(Broker):
    """A queue on Redis Streams.

    Args:
        client: a ``redis.asyncio.Redis`` (or cluster) client, or a ``redis://`` URL.
        queue: the queue name.
        dlq_limit: most entries the dead-letter stream keeps; older ones are trimmed and
            counted in ``stats()['dlq_trimmed']``.
    """

    system = "redis"
    #: redis-py's connection and timeout errors, besides the built-in ones.
    transient_errors = (ConnectionError, TimeoutError, *Broker.transient_errors)

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

    #: Where the next reclaim scan of the pending entries starts (``-``: the beginning).
    _reclaim_from = "-"

    async def reclaim(
        self, count: int, lease_ttl: Callable[[Job | None], float], min_idle: float
    ) -> list[Delivery]:
        if count <= 0 or not self.consumer:
            return []
        limit = max(RECLAIM_SCAN_MIN, count * RECLAIM_SCAN_FACTOR)
        try:
            pending: Any = await self.client.xpending_range(
                self.keys.stream, GROUP, self._reclaim_from, "+", limit,
                idle=max(0, int(min_idle * 1000)),
            )  # fmt: skip
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            await self._ensure_group()
            return []
        # A full page: scan on from its end next time, so entries past the first ``limit``
        # idle ones (waiting for a longer TTL) cannot hide due ones forever.
        full = len(pending) >= limit
        self._reclaim_from = f"({_text(pending[-1]['message_id'])}" if full else "-"
        candidates = [(_text(p["message_id"]), int(p["time_since_delivered"])) for p in pending]
        if not candidates:
            return []
        pipe = self.client.pipeline(transaction=False)
        for entry_id, _ in candidates:
            pipe.xrange(self.keys.stream, entry_id, entry_id)
        ranges: list[Any] = await pipe.execute()
        due = self._due_for_reclaim(candidates, ranges, lease_ttl, count)
        if len(due) >= count:
            self._reclaim_from = "-"  # due entries may be left over in this page
        if not due:
            return []
        keys: list[str] = [self.keys.stream]
        argv: list[Any] = [GROUP, self.consumer]
        for entry_id, own_ms, lease_key, _ in due:
            keys.append(lease_key or self.keys.lease("-"))
            argv += [entry_id, own_ms, 1 if lease_key else 0]
        claimed: Any = await self.batcher.script(_scripts.load("reclaim"), keys, argv)
        fields_of = {entry_id: fields for entry_id, _, _, fields in due}
        out = []
        for entry_id, delivered in claimed:
            fields = fields_of.get(_text(entry_id))
            if fields is not None:  # None: deleted from the stream, now dropped from the PEL
                out.append(_delivery(entry_id, fields, int(delivered)))
        return out

    def _due_for_reclaim(
        self,
        candidates: list[tuple[str, int]],
        ranges: list[Any],
        lease_ttl: Callable[[Job | None], float],
        count: int,
    ) -> list[tuple[str, int, str | None, dict[Any, Any] | None]]:
        """The candidates idle for at least their own job's lease TTL, at most ``count`` of
        them: (entry id, that TTL in ms, the job's lease key or None, the entry's fields or
        None when it is no longer in the stream)."""
        due: list[tuple[str, int, str | None, dict[Any, Any] | None]] = []
        for (entry_id, idle_ms), entries in zip(candidates, ranges, strict=True):
            fields: dict[Any, Any] | None = entries[0][1] if entries else None
            job = _decode_job(fields)
            own_ms = max(0, math.ceil(lease_ttl(job) * 1000))
            if idle_ms < own_ms:
                continue
            due.append((entry_id, own_ms, self.job_lease_key(job) if job else None, fields))
            if len(due) >= count:
                break
        return due

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

    def lock_key(self, name: str) -> str:
        return self.keys.lock(name)

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

    async def ack(
        self, delivery: Delivery, job: Job | None, lease: Lease | None, record_ttl: float = 0.0
    ) -> bool:
        key, token = self._lease_args(delivery, lease)
        if job is not None and job.key is not None and record_ttl > 0:
            record, ttl_ms = self.keys.done(job.key), max(1, int(record_ttl * 1000))
        else:
            record, ttl_ms = self.keys.done(""), 0
        ok = await self.batcher.merged(
            self._ack,
            (self.keys.stream, self.keys.stats),
            (GROUP, self.consumer),
            (key, record),
            (delivery.id, token, ttl_ms, job.id if job else ""),
        )
        return bool(ok)

    async def retry(self, delivery: Delivery, job: Job, run_at: float, lease: Lease | None) -> bool:
        key, token = self._lease_args(delivery, lease)
        ok = await self.batcher.script(
            self._retry,
            [self.keys.stream, self.keys.delayed, key, self.keys.stats],
            [GROUP, token, delivery.id, int(run_at * 1000), job.encode(), self.consumer],
        )
        return bool(ok)

    async def dead_letter(
        self,
        delivery: Delivery,
        job: Job | None,
        failure: Failure,
        attempts: int,
        lease: Lease | None,
    ) -> bool:
        key, token = self._lease_args(delivery, lease)
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
            [GROUP, token, delivery.id, self.dlq_limit, self.consumer, *fields],
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
        # A state whose numbers do not parse gets a "damaged" note (aqw._damage).
        try:
            raw: Any = await self.client.hgetall(self.keys.job_state(job_id))
        except ResponseError as exc:  # WRONGTYPE: someone wrote another type at the key
            return {"job_id": job_id, "damaged": f"the state key is not a hash ({exc})"}
        if not raw:
            return None
        return check_job_state({_text(k): _text(v) for k, v in raw.items()})

    async def job_states(self, limit: int = 1000) -> list[dict[str, str]]:
        limit = max(1, min(limit, 10_000))
        ids: Any = await self.client.zrange(self.keys.running, 0, limit - 1)
        if not ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(self.keys.job_state(_text(job_id)))
        states: Any = await pipe.execute(raise_on_error=False)
        gone = [job_id for job_id, raw in zip(ids, states, strict=True) if not raw]
        if gone:  # their worker died: the state expired, the index entry stayed
            await self.client.zrem(self.keys.running, *gone)
        out = []
        for job_id, raw in zip(ids, states, strict=True):
            if isinstance(raw, Exception):  # WRONGTYPE: not a hash
                damage = f"the state key is not a hash ({raw})"
                out.append({"job_id": _text(job_id), "damaged": damage})
            elif raw:
                out.append(check_job_state({_text(k): _text(v) for k, v in raw.items()}))
        return out

    async def publish_heartbeat(self, worker: str, data: dict[str, Any], ttl: float) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self.keys.worker(worker), json.dumps(data), px=max(1, int(ttl * 1000)))
        pipe.sadd(self.keys.workers, worker)
        await pipe.execute()

    async def heartbeats(self) -> list[dict[str, Any]]:
        """Up to 1000 heartbeats. One that is not JSON, or not of the shape a
        worker or monitor publishes, comes back as ``aqw._damage.damaged_heartbeat``."""
        limit = 1000  # workers read at most: SSCAN, not SMEMBERS, so a forged set is cheap
        names: set[str] = set()
        cursor: Any = 0
        try:
            while True:
                cursor, batch = await self.client.sscan(self.keys.workers, cursor, count=limit)
                names.update(_text(n) for n in batch)
                if not int(cursor) or len(names) >= limit:
                    break
        except ResponseError as exc:  # WRONGTYPE: the workers key is not a set
            return [damaged_heartbeat(self.keys.workers, f"not a set ({exc})")]
        if not names:
            return []
        ordered = sorted(names)[:limit]
        values: Any = await self.client.mget([self.keys.worker(n) for n in ordered])
        gone = [n for n, v in zip(ordered, values, strict=True) if v is None]
        if gone:
            await self.client.srem(self.keys.workers, *gone)
        out: list[dict[str, Any]] = []
        for name, value in zip(ordered, values, strict=True):
            if value is None:
                continue
            beat, problem = parse_json(value)
            problem = problem or heartbeat_damage(beat)
            out.append(beat if problem is None else damaged_heartbeat(name, problem))
        return out

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
        """The counters of the stats hash (at most 1000 fields); a field that is not an
        integer is left out (``aqw status`` names it)."""
        out: dict[str, int] = {}
        cursor: Any = 0
        try:
            while True:
                reply: Any = await self.client.hscan(self.keys.stats, cursor, count=1000)
                cursor, batch = reply
                for k, v in batch.items():
                    n = to_int(v, None)
                    if n is not None:
                        out[_text(k)] = n
                if not int(cursor) or len(out) >= 1000:
                    return out
        except ResponseError:  # WRONGTYPE: not a hash; `aqw status` reports it
            return out

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
    # "replace": a field written by someone else need not be UTF-8, and must not crash a read.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _decode_job(fields: dict[Any, Any] | None) -> Job | None:
    """The job in a stream entry's fields, or None when there is none or it does not decode."""
    data = fields.get(b"j") if fields else None
    if data is None:
        return None
    try:
        return Job.decode(data)
    except Exception:
        return None


def _delivery(entry_id: Any, fields: dict[Any, Any], delivered: int = 1) -> Delivery:
    data = fields.get(b"j")
    if data is None:  # an entry written by someone else: keep it all, so the DLQ shows it
        data = repr({_text(k): v for k, v in fields.items()}).encode()
    return Delivery(id=_text(entry_id), data=data, delivery_count=delivered)


def _dead_job(entry_id: Any, fields: dict[Any, Any]) -> DeadJob:
    """A DLQ entry as a DeadJob; numbers that do not parse get defaults and a note
    (``aqw._damage.DamagedDeadJob``)."""
    f = {_text(k): v for k, v in fields.items()}
    damaged: list[str] = []

    def number(name: str, parse: Callable[[Any, None], float | None], what: str) -> Any:
        raw = f.get(name)
        if raw is None or raw in (b"", ""):
            return 0
        value = parse(raw, None)
        if value is None or not 0 <= value <= 1e11:  # 1e11 s: the year 5138
            damaged.append(f"{name} {shown(raw)} is not {what}")
            return 0
        return value

    data = f.get("j", b"")
    values: dict[str, Any] = {
        "id": _text(entry_id),
        "data": data if isinstance(data, bytes) else _text(data).encode(),
        "task": _text(f.get("task", b"")),
        "job_id": _text(f.get("job_id", b"")),
        "error_type": _text(f.get("error_type", b"")),
        "error": _text(f.get("error", b"")),
        "traceback": _text(f.get("tb", b"")),
        "attempts": int(number("attempts", to_int, "a count")),
        "first_failed_at": float(number("first", to_float, "a time")),
        "last_failed_at": float(number("last", to_float, "a time")),
        "worker": _text(f.get("worker", b"")),
    }
    if damaged:
        return DamagedDeadJob(**values, damaged=tuple(damaged))
    return DeadJob(**values)
