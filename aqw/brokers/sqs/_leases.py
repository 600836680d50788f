"""Job leases as message visibility: the LeaseBackend of an SQS queue (acquire, renew, release
by ChangeMessageVisibility), with an optional lock store for real fencing and resource locks."""

from __future__ import annotations

import time

from ...lease import LeaseBackend
from ..base import Delivery
from ._base import _Held, _SQSBase
from ._limits import _seconds


class _VisibilityLeases:
    """The LeaseBackend of an SQS queue: a job's lease is its message's visibility."""

    def __init__(self, broker: _Leasing) -> None:
        self._broker = broker

    async def acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        return await self._broker._lease_acquire(key, token, ttl_ms)

    async def renew(self, key: str, token: str, ttl_ms: int) -> bool:
        return await self._broker._lease_renew(key, token, ttl_ms)

    async def release(self, key: str, token: str) -> bool:
        return await self._broker._lease_release(key, token)


class _Leasing(_SQSBase):
    """SQSBroker's ``lease_backend`` and ``keep_alive``. Lease keys outside this queue's job
    leases (resource locks) go to ``_locks``: the lock store, else a process-local backend."""

    _lock_store: LeaseBackend | None  # locks=redis://...: fencing tokens and cross-process locks
    _locks: LeaseBackend
    _leases: _VisibilityLeases

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
