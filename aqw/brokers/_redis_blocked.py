"""Damaged state: job lease keys that no live worker holds, each blocking its job for ever.

Crash recovery (``reclaim.lua``) takes over a job's delivery only once its lease key is gone,
so that a live holder is never robbed. A lease key written by someone else (a forged one,
with no expiry or one far past the job's lease TTL) never goes: the job's delivery stays
pending, untouched, and the job never runs again. Such a key is found on request
(``blocked_leases``: ``aqw status``, the dashboard) and cleared only on request
(``release_lease``: ``aqw job release``), never silently.

A job counts as blocked when its stream entry has been pending, untouched, for longer than
``blocked_after`` its task's lease TTL (twice the TTL and a second: a live holder's
renewals refresh that idle time every third of the TTL, and a dead holder's key expires
within one TTL, after which the delivery is reclaimed), its lease key exists, and its record
does not read ``running`` with a lease expiry ahead (what a live holder's renewals keep
moving on). Each read is bounded: ``BLOCKED_SCAN`` pending entries per priority level.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .._damage import to_float, to_int
from .._redis import scripts
from .._redis.client import CLIENT_ERRORS
from .._redis.keys import GROUP
from ..job import MAX_PRIORITY, Job
from ._partitions import split_name
from ._redis_records import decode_job, text
from .base import Broker
from .partitioned import PartitionedBroker
from .redis import RedisBroker

#: Pending entries looked at per priority level (the oldest first).
BLOCKED_SCAN = 100

#: The outcome of ``release_lease``.
Released = Literal["released", "no lease", "held", "changed", "unsupported"]
#: A job's lease TTL when no app says (``aqw.App``'s default).
DEFAULT_TTL = 30.0


class TaskTTLs(Protocol):
    """What ``lease_ttl_of`` needs of the App: its tasks (``aqw.Task``: each has
    ``options.lease_ttl``) and its default lease TTL."""

    @property
    def tasks(self) -> Mapping[str, Any]: ...
    @property
    def lease_ttl(self) -> float: ...


def lease_ttl_of(app: TaskTTLs | None) -> Callable[[Job | None], float]:
    """A job's lease TTL: its task's in ``app``, else the app's (no app: ``DEFAULT_TTL``)."""
    default = app.lease_ttl if app is not None else DEFAULT_TTL
    tasks = app.tasks if app is not None else {}
    return lambda job: tasks[job.task].options.lease_ttl if job and job.task in tasks else default


def blocked_after(ttl: float) -> float:
    """Seconds a job's delivery must have been pending untouched, with its lease key still
    there, for that key to be held by no live worker."""
    return 2 * ttl + 1.0


@dataclass(frozen=True, slots=True)
class BlockedLease:
    """A job blocked by a lease key that no live worker holds."""

    job_id: str
    #: The lease key's value: the token of the unknown holder (as stored, maybe not text).
    token: bytes
    #: Seconds its delivery has been pending untouched.
    held_for: float

    def problem(self, target: str) -> str:
        """The line ``aqw status`` prints (``target``: the options naming the app)."""
        return (
            f"job {self.job_id}: lease key held by an unknown token for {self.held_for:.0f} s; "
            f"clear it with `aqw job release {target} {self.job_id}`"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "token": self.token.decode("utf-8", "replace"),
            "held_for": round(self.held_for, 1),
        }


def _parts(broker: Broker) -> list[RedisBroker]:
    if isinstance(broker, PartitionedBroker):
        return list(broker.parts)
    return [broker] if isinstance(broker, RedisBroker) else []


async def blocked_leases(
    broker: Broker, lease_ttl: Callable[[Job | None], float], limit: int = 20
) -> list[BlockedLease]:
    """Up to ``limit`` jobs of ``broker``'s queue (Redis; none elsewhere) blocked by a lease
    key no live worker holds, longest blocked first. ``lease_ttl``: a job's lease TTL."""
    found: list[BlockedLease] = []
    for part in _parts(broker):
        found += await _blocked_in(part, lease_ttl)
    return sorted(found, key=lambda b: -b.held_for)[:limit]


async def _levels(broker: RedisBroker) -> list[int]:
    members: Any = await broker.client.smembers(broker.keys.levels)
    levels = {to_int(m, 0) for m in members or ()}
    return [0, *sorted(n for n in levels if 0 < n <= MAX_PRIORITY)]


async def _blocked_in(
    broker: RedisBroker, lease_ttl: Callable[[Job | None], float]
) -> list[BlockedLease]:
    candidates: list[tuple[Job, float]] = []
    for level in await _levels(broker):
        stream = broker.keys.stream_for(level)
        try:
            pending: Any = await broker.client.xpending_range(
                stream, GROUP, "-", "+", BLOCKED_SCAN, idle=int(blocked_after(0) * 1000)
            )
        except CLIENT_ERRORS:  # no such stream or group (yet): nothing pending there
            continue
        if not pending:
            continue
        pipe = broker.client.pipeline(transaction=False)
        for p in pending:
            pipe.xrange(stream, text(p["message_id"]), text(p["message_id"]))
        for p, entries in zip(pending, await pipe.execute(raise_on_error=False), strict=True):
            job = decode_job(entries[0][1]) if isinstance(entries, list) and entries else None
            idle = int(p["time_since_delivered"]) / 1000
            if job is not None and idle > blocked_after(lease_ttl(job)):
                candidates.append((job, idle))
    return await _unheld(broker, candidates)


async def _unheld(
    broker: RedisBroker, candidates: Iterable[tuple[Job, float]]
) -> list[BlockedLease]:
    """The candidates whose lease key exists while their record shows no live holder."""
    jobs = list(candidates)
    if not jobs:
        return []
    pipe = broker.client.pipeline(transaction=False)
    for job, _ in jobs:
        pipe.get(broker.keys.lease(job.id))
        pipe.hmget(broker.keys.record(job.id), "state", "lease_expires_at")
    replies = await pipe.execute(raise_on_error=False)
    now = time.time()
    out: list[BlockedLease] = []
    for i, (job, idle) in enumerate(jobs):
        token, record = replies[2 * i], replies[2 * i + 1]
        if not isinstance(token, bytes) or _live(record, now):
            continue
        out.append(BlockedLease(job.id, token, idle))
    return out


def _live(record: Any, now: float) -> bool:
    """True when a record (HMGET state, lease_expires_at) shows a live holder."""
    if not isinstance(record, list) or len(record) != 2:
        return False
    state, expires = record
    return state == b"running" and to_float(expires, 0.0) > now


@dataclass(frozen=True, slots=True)
class Release:
    """What ``release_lease`` did: ``outcome``, the token seen, and for ``held`` the holder."""

    outcome: Released
    token: bytes = b""
    worker: str = ""
    expires_in: float = 0.0


async def release_lease(broker: Broker, job_id: str) -> Release:
    """Delete job ``job_id``'s lease key, only if it still holds the token read first and
    no live worker holds it (its record reads ``running`` with a lease expiry ahead):
    ``held`` then, and nothing is deleted; ``no lease`` when there is no key, ``changed``
    when the token changed meanwhile, ``unsupported`` on a broker that keeps job leases in
    the worker process (memory, SQS)."""
    parts = _parts(broker)
    if not parts:
        return Release("unsupported")
    if isinstance(broker, PartitionedBroker):
        p = split_name(job_id, broker.partitions)[1]
        parts = parts if p is None else [parts[p]]
    for part in parts:
        key = part.keys.lease(job_id)
        pipe = part.client.pipeline(transaction=False)
        pipe.get(key)
        pipe.hmget(part.keys.record(job_id), "state", "lease_expires_at", "worker")
        token, record = await pipe.execute(raise_on_error=False)
        if not isinstance(token, bytes):
            continue
        now = time.time()
        if isinstance(record, list) and len(record) == 3 and _live(record[:2], now):
            return Release("held", token, text(record[2] or ""), to_float(record[1], now) - now)
        done = await part.batcher.script(scripts.load("lease_release"), [key], [token])
        return Release("released" if done else "changed", token)
    return Release("no lease")
