"""One PostgreSQL connection set per URL in a process: a pool for the queries of every queue
beside each other (``sibling``), and one listening connection whose notifications wake
the blocking fetches (LISTEN/NOTIFY, a channel per queue)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable
from typing import Any

from ...errors import ConfigError
from ._sql import migrate

#: Seconds a connection attempt may take.
CONNECT_TIMEOUT = 10.0


def channel_of(schema: str, queue: str) -> str:
    """The NOTIFY channel of a queue: short (PostgreSQL cuts names at 63 bytes)."""
    return "aqw_" + hashlib.sha1(f"{schema}:{queue}".encode()).hexdigest()[:24]


class Connection:
    """The pool and the listener of one database, opened once and shared by the brokers of
    every queue on it."""

    def __init__(self, dsn: str, schema: str, pool_size: int) -> None:
        self.dsn = dsn
        self.schema = schema
        self.pool_size = pool_size
        self.pool: Any = None
        self._listener: Any = None
        self._wakers: dict[str, asyncio.Event] = {}
        #: Per channel, the callbacks given each notification's payload (``subscribe``).
        self._hearers: dict[str, list[Callable[[str], None]]] = {}
        self._lock: asyncio.Lock | None = None
        #: Brokers connected on it: the last one to close closes it.
        self.users = 0

    async def open(self) -> None:
        if self.pool is not None:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.pool is not None:
                return
            try:
                import asyncpg
            except ImportError as exc:  # pragma: no cover - depends on installed extras
                raise ConfigError(
                    "the postgresql:// broker needs the 'postgres' extra: pip install "
                    "'aqw[postgres]'"
                ) from exc
            pool = await asyncpg.create_pool(
                self.dsn, min_size=1, max_size=self.pool_size, timeout=CONNECT_TIMEOUT
            )
            try:
                async with pool.acquire() as conn:
                    await migrate(conn, self.schema)
                self._listener = await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT)
                for channel in self._wakers:
                    await self._listener.add_listener(channel, self._notified)
            except BaseException:
                await pool.close()
                raise
            self.pool = pool

    async def listen(self, channel: str) -> asyncio.Event:
        """Open, and the event set by each notification on ``channel``."""
        await self.open()
        event = self._wakers.get(channel)
        if event is None:
            event = self._wakers[channel] = asyncio.Event()
            await self._listener.add_listener(channel, self._notified)
        return event

    async def subscribe(self, channel: str, hear: Callable[[str], None]) -> None:
        """Open, and call ``hear(payload)`` at each notification on ``channel``."""
        await self.listen(channel)
        self._hearers.setdefault(channel, []).append(hear)

    async def relisten(self) -> bool:
        """Reopen the listener when the server cut it (a restart, ``pg_terminate_backend``):
        True when it listens again. Called by a fetch that waited without a notification."""
        if self.pool is None or self._listener is None or not self._listener.is_closed():
            return False
        import asyncpg

        listener = await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT)
        for channel in self._wakers:
            await listener.add_listener(channel, self._notified)
        self._listener = listener
        return True

    def _notified(self, _conn: object, _pid: int, channel: str, payload: str) -> None:
        event = self._wakers.get(channel)
        if event is not None:
            event.set()
        for hear in self._hearers.get(channel, ()):
            hear(payload)

    async def close(self) -> None:
        pool, listener = self.pool, self._listener
        self.pool = self._listener = None
        if listener is not None:
            with contextlib.suppress(Exception):
                await listener.close(timeout=2)
        if pool is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pool.close(), 5)
