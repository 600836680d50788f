"""A job's start on Redis, under its lease and its limits (``job_start.lua``): the start
step of ``RedisBroker.job_lease_backend``."""

from __future__ import annotations

import functools
import random
import time
from typing import Any

from ..._redis.keys import GROUP
from ..._redis.lease import RedisLeaseBackend
from ..._redis.scripts import ms
from ...errors import FenceCorrupted, JobCancelled, RateLimited, StaleStart
from ...flow import Limits, cap_wait, rate_wait
from ...job import Job
from ...record import UNFINISHED_KEEP
from ..messages import Delivery
from ._jobs import RedisJobs


def _limit_args(limits: Limits) -> tuple[Any, ...]:
    """A job's limit values in ``job_start.lua``'s per-job ARGV (after its head, which
    counts them)."""
    caps = [x for cap in limits.caps for x in cap]
    bucket = limits.bucket or ""
    return (bucket, limits.interval_us, limits.tolerance_us, len(limits.caps), *caps)


@functools.lru_cache(maxsize=64)
def _start_head(prefix: str, worker: str, ttl_ms: int) -> tuple[Any, ...]:
    """``job_start.lua``'s shared ARGV: the same for every job a worker starts with a TTL."""
    return (prefix, worker, ms(UNFINISHED_KEEP), ttl_ms, GROUP)


def refusal(reply: Any) -> RateLimited | None:
    """The ``aqw.RateLimited`` of a job start refused for a limit, or None."""
    if not isinstance(reply, list):
        return None
    reason = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
    if reason == "rate_limit":
        return RateLimited(rate_wait(int(reply[1])), reason=reason)
    return RateLimited(cap_wait(int(reply[1]), random.random()), reason=reason)


class RedisJobLease:
    """A job's lease backend (``RedisBroker.job_lease_backend``): ``acquire`` runs
    ``job_start.lua``, which takes the lease and marks the record running in one step,
    refuses a cancelled job (``JobCancelled``, taking nothing), a stale start
    (``StaleStart``, taking nothing: ``delivery`` is no longer pending to this consumer in
    its level's stream, or the job's record has ended, its delivery then dropped) and, with
    ``limits``, a job over its rate limit or per-key cap (``aqw.RateLimited``, taking
    nothing); ``renew`` (``job_renew.lua``) also moves the record's lease expiry on and
    keeps the job's cap sets alive; ``release`` is the plain one."""

    __slots__ = ("_entry", "_fence", "_job", "_jobs", "_limits", "_worker")

    def __init__(
        self,
        jobs: RedisJobs,
        job: Job,
        worker: str,
        limits: Limits | None,
        delivery: Delivery | None = None,
    ) -> None:
        self._jobs = jobs
        self._job = job
        self._worker = worker
        self._limits = limits or None
        self._fence = ""  # the fencing token of the lease taken, once taken
        #: "<level> <entry id>" of the delivery started ("0 -": none to check)
        self._entry = "0 -" if delivery is None else f"{delivery.level} {delivery.id}"

    async def acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        jobs, job, limits = self._jobs, self._job, self._limits
        values = () if limits is None else _limit_args(limits)
        try:
            # by the priority lane, as the renewals: the lease's expiry counts from this send
            fence = await jobs.batcher.priority.merged(
                jobs.job_start,
                (jobs.keys.fence,),
                _start_head(jobs.prefix, self._worker, ttl_ms),
                (),
                (f"{len(values)} {token} {job.attempt} {self._entry} {job.id}", *values),
            )
        except Exception as exc:  # redis-py's ResponseError carries the script's error
            message = str(exc)
            if not message.startswith(RedisLeaseBackend.FENCE_ERROR):
                raise
            value = message.rpartition("exhausted: ")[2] or "unknown"
            raise FenceCorrupted(jobs.keys.fence, value) from None
        if isinstance(fence, list):  # a limit refused it
            refused = refusal(fence)
            if refused is not None:
                raise refused
        if int(fence) < 0:
            if int(fence) == -1:
                raise JobCancelled(job.id)
            raise StaleStart(job.id, ended=int(fence) == -3)
        if int(fence) > 0:
            self._fence = str(int(fence))
        return int(fence) or None

    async def renew(self, key: str, token: str, ttl_ms: int) -> bool:
        jobs = self._jobs
        expires = repr(time.time() + ttl_ms / 1000)
        caps = self._limits.cap_keys if self._limits is not None else ()
        renewed = await jobs.batcher.priority.script(  # never behind other traffic
            jobs.job_renew,
            [key, jobs.keys.record(self._job.id), *(jobs.keys.slots(c) for c in caps)],
            [token, ttl_ms, self._fence, expires, ms(UNFINISHED_KEEP)],
        )
        return bool(renewed)

    async def release(self, key: str, token: str) -> bool:
        return await self._jobs.leases.release(key, token)
