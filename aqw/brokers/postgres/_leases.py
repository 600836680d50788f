"""Leases in PostgreSQL: a row per key (token, expiry on the server's clock), and a fencing
token drawn from the schema's sequence in the same statement as a successful acquire."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ._batch import Batcher
from ._sql import statement


class Connected(Protocol):
    """A broker whose pool opens at ``connect``."""

    @property
    def pool(self) -> Any: ...
    async def connect(self) -> None: ...


class PgLeases:
    """The ``LeaseBackend`` of a PostgreSQL queue (job leases, locks, leader leases). The
    acquires made while one is on its way go out together, one statement and one commit."""

    __slots__ = ("_acquire", "_acquire_many", "_batch", "_pool", "_queue", "_release", "_renew")

    def __init__(self, pool: Any, schema: str, queue: str) -> None:
        self._pool = pool
        self._queue = queue
        self._acquire = statement("lease_acquire", schema)
        self._acquire_many = statement("lease_acquire_many", schema)
        self._renew = statement("lease_renew", schema)
        self._release = statement("lease_release", schema)
        self._batch: Batcher[tuple[str, str, int], int | None] = Batcher(self._run)

    async def acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        return await self._batch.submit((key, token, ttl_ms))

    async def _run(self, calls: Sequence[tuple[str, str, int]]) -> list[int | None]:
        keys = [c[0] for c in calls]
        if len(set(keys)) < len(keys) or len(calls) == 1:  # one statement may not write a
            out = []  # row twice: the same key twice goes one by one, in order
            for key, token, ttl_ms in calls:
                fence = await self._pool.fetchval(self._acquire, key, token, ttl_ms)
                out.append(None if fence is None else int(fence))
            return out
        rows = await self._pool.fetch(
            self._acquire_many, keys, [c[1] for c in calls], [c[2] for c in calls]
        )
        taken = {r["key"]: int(r["fence"]) for r in rows}
        return [taken.get(k) for k in keys]

    async def renew(self, key: str, token: str, ttl_ms: int) -> bool:
        return await self._pool.fetchval(self._renew, key, token, ttl_ms) is not None

    async def release(self, key: str, token: str) -> bool:
        return await self._pool.fetchval(self._release, key, token) is not None


class PoolOf:
    """The broker's pool, looked up at each call (it opens at the broker's ``connect``)."""

    __slots__ = ("_broker",)

    def __init__(self, broker: Connected) -> None:
        self._broker = broker

    async def _open(self) -> Any:
        await self._broker.connect()
        return self._broker.pool

    async def fetchval(self, sql: str, *args: Any) -> Any:
        return await (await self._open()).fetchval(sql, *args)

    async def fetch(self, sql: str, *args: Any) -> Any:
        return await (await self._open()).fetch(sql, *args)

    async def execute(self, sql: str, *args: Any) -> Any:
        return await (await self._open()).execute(sql, *args)

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        return await (await self._open()).fetchrow(sql, *args)

    async def connected(self) -> None:
        """Connect the broker (before ``acquire``)."""
        await self._broker.connect()

    def acquire(self) -> Any:
        return self._broker.pool.acquire()
