"""One PostgreSQL connection set per URL in a process: a pool for the queries of every queue
beside each other (``sibling``), and one listening connection whose notifications wake
the blocking fetches (LISTEN/NOTIFY, a channel per queue)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

from ...errors import ConfigError
from ._sql import migrate, statement

log = logging.getLogger("aqw.brokers.postgres")

#: Seconds a connection attempt may take.
CONNECT_TIMEOUT = 10.0
#: The server ends a pool connection's transaction left idle this long (its process frozen
#: or lost: the broker's own transactions run their statements back to back), so a paused
#: holder's row locks (a job, a lease, a counter every settle bumps) do not stall every
#: other worker for as long as it is paused. ``ctx.transaction()`` turns it off for the
#: handler's part of its transaction (``_settle.py``).
IDLE_IN_TRANSACTION = "5s"
#: The ``application_name`` of the pool's sessions (unless the URL names one): how the check
#: for stalled sessions (``end_stalled``) tells aqw's own from the application's.
APPLICATION_NAME = "aqw"
#: A pool session stopped this many seconds halfway through a statement's messages is ended
#: (``sql/end_stalled.sql``): the idle-in-transaction bound's counterpart for a process frozen
#: between a statement's parse and its execution, which the server counts as active.
STALLED_AFTER = 5.0
#: Seconds between two checks for stalled sessions by one process.
STALLED_CHECK_EVERY = 2.5


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
        #: One LISTEN at a time on the listener (asyncpg refuses a second operation while one
        #: is in progress), and a caller returns only once its channel is listened to.
        self._listening: asyncio.Lock | None = None
        self._stalled_checked = 0.0
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
            from ._reset import BrokerConnection, reset

            pool = await asyncpg.create_pool(
                self.dsn,
                min_size=1,
                max_size=self.pool_size,
                timeout=CONNECT_TIMEOUT,
                connection_class=BrokerConnection,
                reset=reset,
                server_settings=self._settings(),
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

    def _settings(self) -> dict[str, str]:
        settings = {"idle_in_transaction_session_timeout": IDLE_IN_TRANSACTION}
        if "application_name" not in self.dsn:
            settings["application_name"] = APPLICATION_NAME
        return settings

    async def end_stalled(self) -> int:
        """End the pool sessions of this role, of any process, stalled halfway through a
        statement for over ``STALLED_AFTER`` seconds (at most every ``STALLED_CHECK_EVERY``
        seconds); how many were ended."""
        now = time.monotonic()
        if self.pool is None or now - self._stalled_checked < STALLED_CHECK_EVERY:
            return 0
        self._stalled_checked = now
        sql = statement("end_stalled", self.schema)
        rows = await self.pool.fetch(sql, APPLICATION_NAME, STALLED_AFTER)
        ended = [r["pid"] for r in rows if r["ended"]]
        if ended:
            log.warning(
                "ended %d PostgreSQL session(s) of a stalled aqw process (server pid %s): stopped "
                "halfway through a statement for over %.0fs while holding its locks",
                len(ended),
                ", ".join(map(str, ended)),
                STALLED_AFTER,
            )
        return len(ended)

    async def listen(self, channel: str) -> asyncio.Event:
        """Open, and the event set by each notification on ``channel``."""
        await self.open()
        event = self._wakers.get(channel)
        if event is not None:
            return event
        async with self._listen_lock():
            event = self._wakers.get(channel)
            if event is None:
                await self._listener.add_listener(channel, self._notified)
                event = self._wakers[channel] = asyncio.Event()
        return event

    def _listen_lock(self) -> asyncio.Lock:
        if self._listening is None:
            self._listening = asyncio.Lock()
        return self._listening

    async def subscribe(self, channel: str, hear: Callable[[str], None]) -> None:
        """Open, and call ``hear(payload)`` at each notification on ``channel``."""
        await self.listen(channel)
        self._hearers.setdefault(channel, []).append(hear)

    def unsubscribe(self, channel: str, hear: Callable[[str], None]) -> None:
        """Stop calling ``hear`` for ``channel`` (the channel stays listened to)."""
        hearers = self._hearers.get(channel, [])
        if hear in hearers:
            hearers.remove(hear)

    async def relisten(self) -> bool:
        """Reopen the listener when the server cut it (a restart, ``pg_terminate_backend``):
        True when it listens again. Called by a fetch that waited without a notification."""
        if self.pool is None or self._listener is None or not self._listener.is_closed():
            return False
        import asyncpg

        async with self._listen_lock():
            if self._listener is None:  # closed meanwhile
                return False
            if not self._listener.is_closed():  # another fetch reopened it meanwhile
                return True
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
