"""Leases in PostgreSQL: a row per key (token, expiry on the server's clock), and a fencing
token drawn from the schema's sequence in the same statement as a successful acquire."""

from __future__ import annotations

from typing import Any, Protocol

from ._sql import statement


class Connected(Protocol):
    """A broker whose pool opens at ``connect``."""

    @property
    def pool(self) -> Any: ...
    async def connect(self) -> None: ...


class PgLeases:
    """The ``LeaseBackend`` of a PostgreSQL queue (job leases, locks, leader leases)."""

    __slots__ = ("_acquire", "_pool", "_queue", "_release", "_renew")

    def __init__(self, pool: Any, schema: str, queue: str) -> None:
        self._pool = pool
        self._queue = queue
        self._acquire = statement("lease_acquire", schema)
        self._renew = statement("lease_renew", schema)
        self._release = statement("lease_release", schema)

    async def acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        fence = await self._pool.fetchval(self._acquire, key, token, ttl_ms)
        return None if fence is None else int(fence)

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

    def acquire(self) -> Any:
        return self._broker.pool.acquire()
