"""Leases in the process (``MemoryBroker.lease_backend``, and SQS's lock store without
``locks=``): a dict with the Redis backend's semantics (expiry, token compare, fencing)."""

from __future__ import annotations

from .clock import clock


class MemoryLeaseBackend:
    """Leases in a dict, with the Redis backend's semantics (expiry, token compare, fencing)."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[str, float]] = {}
        self._fence = 0

    def _current(self, key: str) -> str | None:
        entry = self._held.get(key)
        if entry is None:
            return None
        if entry[1] <= clock.monotonic():
            del self._held[key]
            return None
        return entry[0]

    async def acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        current = self._current(key)
        if current is not None and current != token:  # held by this token: taken again
            return None
        self._held[key] = (token, clock.monotonic() + ttl_ms / 1000)
        self._fence += 1
        return self._fence

    async def renew(self, key: str, token: str, ttl_ms: int) -> bool:
        if self._current(key) != token:
            return False
        self._held[key] = (token, clock.monotonic() + ttl_ms / 1000)
        return True

    async def release(self, key: str, token: str) -> bool:
        if self._current(key) != token:
            return False
        del self._held[key]
        return True

    def owner(self, key: str) -> str | None:
        return self._current(key)

    def drop(self, key: str) -> None:
        """Free ``key`` whoever holds it (a broker's settle step that has checked the token)."""
        self._held.pop(key, None)
