"""Damaged state: job lease keys that no live worker holds, each blocking its job for ever.

Crash recovery (``reclaim.lua``) takes over a job's delivery only once its lease key is gone,
so that a live holder is never robbed. A lease key written by someone else (a forged one,
with no expiry or one far past the job's lease TTL) never goes: the job's delivery stays
pending, untouched, and the job never runs again. Such a key is found on request
(``blocked_leases``: ``aqw status``, the dashboard) and cleared only on request
(``release_lease``: ``aqw job release``), never silently. Both are reached through the queue's
``ServerInfo`` part (``RedisServer``), which covers each partition's keys.

A job counts as blocked when its stream entry has been pending, untouched, for longer than
``blocked_after`` its task's lease TTL (twice the TTL and a second: a live holder's
renewals refresh that idle time every third of the TTL, and a dead holder's key expires
within one TTL, after which the delivery is reclaimed), its lease key exists, and its record
does not read ``running`` with a lease expiry ahead (what a live holder's renewals keep
moving on). Each read is bounded: ``BLOCKED_SCAN`` pending entries per priority level.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from redis.asyncio import Redis

from ..._readback import to_float, to_int
from ..._redis import scripts
from ..._redis.client import CLIENT_ERRORS
from ..._redis.keys import GROUP, QueueKeys
from ...job import MAX_PRIORITY, Job
from ..messages import BlockedLease, Release
from ._entries import decode_job, text
from ._partitions import split_name

#: Pending entries looked at per priority level (the oldest first).
BLOCKED_SCAN = 100


def blocked_after(ttl: float) -> float:
    """Seconds a job's delivery must have been pending untouched, with its lease key still
    there, for that key to be held by no live worker."""
    return 2 * ttl + 1.0


async def blocked_leases(
    client: Redis,
    parts: Sequence[QueueKeys],
    lease_ttl: Callable[[Job | None], float],
    limit: int = 20,
) -> list[BlockedLease]:
    """Up to ``limit`` jobs of the queue whose keys are ``parts`` (one per partition) blocked
    by a lease key no live worker holds, longest blocked first. ``lease_ttl``: a job's lease
    TTL."""
    found: list[BlockedLease] = []
    for keys in parts:
        found += await _blocked_in(client, keys, lease_ttl)
    return sorted(found, key=lambda b: -b.held_for)[:limit]


async def _levels(client: Redis, keys: QueueKeys) -> list[int]:
    members: Any = await client.smembers(keys.levels)
    levels = {to_int(m, 0) for m in members or ()}
    return [0, *sorted(n for n in levels if 0 < n <= MAX_PRIORITY)]


async def _blocked_in(
    client: Redis, keys: QueueKeys, lease_ttl: Callable[[Job | None], float]
) -> list[BlockedLease]:
    candidates: list[tuple[Job, float]] = []
    for level in await _levels(client, keys):
        stream = keys.stream_for(level)
        try:
            pending: Any = await client.xpending_range(
                stream, GROUP, "-", "+", BLOCKED_SCAN, idle=int(blocked_after(0) * 1000)
            )
        except CLIENT_ERRORS:  # no such stream or group (yet): nothing pending there
            continue
        if not pending:
            continue
        pipe = client.pipeline(transaction=False)
        for p in pending:
            pipe.xrange(stream, text(p["message_id"]), text(p["message_id"]))
        for p, entries in zip(pending, await pipe.execute(raise_on_error=False), strict=True):
            job = decode_job(entries[0][1]) if isinstance(entries, list) and entries else None
            idle = int(p["time_since_delivered"]) / 1000
            if job is not None and idle > blocked_after(lease_ttl(job)):
                candidates.append((job, idle))
    return await _unheld(client, keys, candidates)


async def _unheld(
    client: Redis, keys: QueueKeys, candidates: Iterable[tuple[Job, float]]
) -> list[BlockedLease]:
    """The candidates whose lease key exists while their record shows no live holder."""
    jobs = list(candidates)
    if not jobs:
        return []
    pipe = client.pipeline(transaction=False)
    for job, _ in jobs:
        pipe.get(keys.lease(job.id))
        pipe.hmget(keys.record(job.id), "state", "lease_expires_at")
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


async def release_lease(client: Redis, parts: Sequence[QueueKeys], job_id: str) -> Release:
    """Delete job ``job_id``'s lease key, only if it still holds the token read first and
    no live worker holds it (its record reads ``running`` with a lease expiry ahead):
    ``held`` then, and nothing is deleted; ``no lease`` when there is no key, ``changed``
    when the token changed meanwhile. ``parts``: the queue's keys, one per partition (the
    job id names its partition when there are several)."""
    if len(parts) > 1:
        p = split_name(job_id, len(parts))[1]
        parts = parts if p is None else [parts[p]]
    for keys in parts:
        key = keys.lease(job_id)
        pipe = client.pipeline(transaction=False)
        pipe.get(key)
        pipe.hmget(keys.record(job_id), "state", "lease_expires_at", "worker")
        token, record = await pipe.execute(raise_on_error=False)
        if not isinstance(token, bytes):
            continue
        now = time.time()
        if isinstance(record, list) and len(record) == 3 and _live(record[:2], now):
            return Release("held", token, text(record[2] or ""), to_float(record[1], now) - now)
        done = await scripts.load("lease_release")(client, [key], [token])
        return Release("released" if done else "changed", token)
    return Release("no lease")
