"""Rate limits and per-key caps in the process (the memory broker): the same rules as
``job_start.lua`` (GCRA, and caps counted over the holders' live leases), over
one event loop's jobs."""

from __future__ import annotations

import random
from collections.abc import Callable

from ...errors import RateLimited
from ...flow import Limits, cap_wait, rate_wait
from .clock import clock


class _Bucket:
    __slots__ = ("promised", "tat")

    def __init__(self) -> None:
        self.tat = 0  # theoretical arrival time, microseconds
        self.promised = 0  # the turn last promised to a refused job


#: The token holding a lease key, None when it is free (``MemoryLeaseBackend.owner``).
Alive = Callable[[str], str | None]


class LocalLimiter:
    """The rate buckets and cap holders of one in-process queue. ``alive(lease_key)`` says
    whether a holder's lease is still held."""

    def __init__(self) -> None:
        self._buckets: dict[str, _Bucket] = {}
        self._holders: dict[str, set[str]] = {}

    def refusal(self, limits: Limits, lease_key: str, alive: Alive) -> RateLimited | None:
        """Why a job holding ``lease_key`` may not start now under ``limits`` (promising a
        rate-limited job its turn), or None."""
        now = _now_us()
        if limits.bucket is not None:
            bucket = self._buckets.get(limits.bucket)
            if bucket is not None and bucket.tat - limits.tolerance_us > now:
                turn = max(bucket.tat - limits.tolerance_us, bucket.promised)
                bucket.promised = turn + limits.interval_us
                return RateLimited(rate_wait(turn - now), reason="rate_limit")
        for key, most in limits.caps:
            holders = self._holders.get(key, set())
            holders.difference_update([h for h in holders if alive(h) is None])
            if lease_key not in holders and len(holders) >= most:
                return RateLimited(cap_wait(0, random.random()), reason="concurrency")
        return None

    def admit(self, limits: Limits, lease_key: str, alive: Alive) -> None:
        """Count a start under ``limits``: the bucket's next turn, a slot in each cap."""
        now = _now_us()
        if limits.bucket is not None:
            bucket = self._buckets.setdefault(limits.bucket, _Bucket())
            bucket.tat = max(bucket.tat, now) + limits.interval_us
        for key, _ in limits.caps:
            self._holders.setdefault(key, set()).add(lease_key)
        self._sweep(now, alive)

    def _sweep(self, now: int, alive: Alive) -> None:
        """Forget idle buckets and empty caps, once there are many (bounded memory)."""
        if len(self._buckets) + len(self._holders) < 1024:
            return
        for name, b in list(self._buckets.items()):
            if max(b.tat, b.promised) <= now:
                del self._buckets[name]
        for key, holders in list(self._holders.items()):
            holders.difference_update([h for h in holders if alive(h) is None])
            if not holders:
                del self._holders[key]


def _now_us() -> int:
    return int(clock.time() * 1e6)
