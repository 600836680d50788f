"""Job leases as message visibility: the LeaseBackend of an SQS queue (acquire, renew, release
by ChangeMessageVisibility, ``VisibilityLeases``), with an optional lock store for real fencing
and resource locks (``LockStore``)."""

from __future__ import annotations

import contextlib
import time

from ..._redis.client import make_client
from ..._redis.lease import RedisLeaseBackend
from ...errors import StaleStart
from ...lease import Lease, LeaseBackend
from ..local import MemoryLeaseBackend
from ._connection import Connection
from ._held import Held, HeldMessages
from ._limits import visibility_seconds
from ._queues import Queues


class LockStore:
    """Where leases that are not a message's visibility live: with ``locks=redis://...`` a
    Redis LeaseBackend (opened on connect, dropped on close) that also fences job leases and
    makes resource locks exclusive across processes; else a process-local backend."""

    def __init__(self, store: LeaseBackend | str | None) -> None:
        #: The ``locks=`` URL, when the store is opened from one.
        self.url = store if isinstance(store, str) else None
        #: The real store (fencing tokens, cross-process locks), None without one.
        self.shared: LeaseBackend | None = None if isinstance(store, str) else store
        #: Where resource locks go: the shared store, else a process-local one.
        self.locks: LeaseBackend = self.shared or MemoryLeaseBackend()

    def open(self, stack: contextlib.AsyncExitStack) -> None:
        """Connect the ``locks=`` store; ``stack`` closes its client."""
        if self.url is not None and self.shared is None:
            client = make_client(self.url)
            stack.push_async_callback(client.aclose)
            self.shared = self.locks = RedisLeaseBackend(client)

    def close(self) -> None:
        if self.url is not None:
            self.shared = None
            self.locks = MemoryLeaseBackend()

    async def unlock(self, lease: Lease | None) -> None:
        """Free a settled job's lease in the shared store (best effort)."""
        if lease is not None and self.shared is not None:
            with contextlib.suppress(Exception):
                await self.shared.release(lease.key, lease.token)


class VisibilityLeases:
    """The LeaseBackend of an SQS queue: a job's lease is its message's visibility. Lease keys
    outside this queue's job leases (resource locks) go to the lock store."""

    def __init__(
        self, connection: Connection, queues: Queues, held: HeldMessages, locks: LockStore
    ) -> None:
        self._connection = connection
        self._queues = queues
        self._held = held
        self._locks = locks

    async def acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        """A job's start: unless the message is surely hidden for a good part of the lease
        still (``visible_until`` counts from the receive's send: a pause after it cannot make
        it look longer), its visibility is first set to the lease with the receipt held for
        it; another consumer may have received, run and deleted the message meanwhile, and a
        receipt SQS refuses raises ``StaleStart``, taking nothing. (moto refuses the receipt
        of a deleted message, but takes the stale receipt of a message received again.)"""
        if not self._held.is_job_key(key):
            return await self._locks.locks.acquire(key, token, ttl_ms)
        found = self._held.of_job(key)
        if found is None or found[1].token not in (None, token):
            return None
        mid, held = found
        ttl = visibility_seconds(ttl_ms)
        if held.visible_until - time.monotonic() < ttl / 3 + 1.0 and not await self._extend(
            held, ttl
        ):
            self._held.forget(mid)
            raise StaleStart(key.removeprefix(self._held.lease_prefix))
        fence: int | None = held.count
        store = self._locks.shared
        if store is not None:
            fence = await store.acquire(key, token, ttl_ms)
            if fence is None:
                return None
        held.token = token
        return fence

    async def renew(self, key: str, token: str, ttl_ms: int) -> bool:
        if not self._held.is_job_key(key):
            return await self._locks.locks.renew(key, token, ttl_ms)
        found = self._held.of_job(key)
        if found is None or found[1].token != token:
            return False
        ok = await self._extend(found[1], visibility_seconds(ttl_ms))
        store = self._locks.shared
        if ok and store is not None:
            ok = await store.renew(key, token, ttl_ms)
        return ok

    async def release(self, key: str, token: str) -> bool:
        if not self._held.is_job_key(key):
            return await self._locks.locks.release(key, token)
        found = self._held.of_job(key)
        if found is not None and found[1].token == token:
            self._held.forget(found[0])  # the message comes back when its visibility runs out
        store = self._locks.shared
        if store is not None:
            await store.release(key, token)
        return True

    async def _extend(self, held: Held, seconds: int) -> bool:
        sent = time.monotonic()
        ok = await self._connection.set_visibility(held.receipt, seconds, self._queues.url)
        if ok:
            held.visible_until = sent + seconds
        return ok
