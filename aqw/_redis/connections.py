"""Connections whose writes are bounded by ``asyncio.timeout`` rather than redis-py's
``asyncio.wait_for``, and that are opened anew when the server closed them while they sat
in the pool (``_drop_if_closed``).

redis-py bounds each command's write with ``asyncio.wait_for(send, socket_timeout)``, which
on Python 3.11 runs the write as a task of its own: about 50 us of CPU per command here
(a single awaited enqueue cost 175-185 us of producer CPU with it, 121-127 without), and a
cancellation that lands as that task completes is swallowed. The same bound, as a timeout
scope around redis-py's plain write, costs a timer. Reads keep redis-py's own bound (already
a timeout scope).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Iterable
from typing import Any

from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

from .cluster import is_cluster


async def _send(conn: Any, send: Any, command: Any, check_health: bool) -> None:
    """``send(command, check_health)`` (redis-py's write) within ``conn.socket_timeout``,
    with the connection's own bound off meanwhile, so it writes in this task."""
    timeout = conn.socket_timeout
    if not timeout:
        await send(command, check_health)
        return
    conn.socket_timeout = None
    try:
        async with asyncio.timeout(timeout):
            await send(command, check_health)
    except TimeoutError:  # redis-py has closed the connection (it does on any BaseException)
        raise RedisTimeoutError("Timeout writing to socket") from None
    finally:
        conn.socket_timeout = timeout


async def _drop_if_closed(conn: Any) -> None:
    """Disconnect ``conn`` when the server has closed it (its stream is at EOF), so the
    ``connect`` that follows opens a new one.

    The pool checks a connection it hands out, but redis-py 8.1 skips that check whenever
    maintenance notifications are on, and they are (``"auto"``) on every RESP3 pool: a
    connection the server closed while it sat in the pool (a Redis restart, an idle
    timeout, ``CLIENT KILL``) was handed out as it was, and its next command failed with
    "Connection closed by server" without having reached any server. Nothing was sent on
    it yet, so opening a new one is right for every command, an XADD included."""
    reader = getattr(conn, "_reader", None)
    if reader is None:
        return
    if getattr(reader, "_loop", None) is not asyncio.get_running_loop():
        _forget(conn)
    elif reader.at_eof():
        await conn.disconnect()


def _forget(conn: Any) -> None:
    """Close ``conn``'s socket without its event loop, and mark it disconnected: it was
    opened in another loop (an app kept at module level, used by tests that each run in a
    loop of their own, the last one closed). Its reader and writer belong to that loop:
    redis-py's ``disconnect`` would schedule the close there ("Event loop is closed")."""
    writer = getattr(conn, "_writer", None)
    loop = getattr(writer, "_loop", None)
    if writer is not None and loop is not None and not loop.is_closed():
        loop.call_soon_threadsafe(writer.close)  # its loop still runs: closed there
    else:
        transport: Any = getattr(writer, "transport", None)
        sock = getattr(transport, "_sock", None)
        if sock is not None:  # asyncio's selector transport, whose loop is gone: by hand
            sock.close()
            transport._sock = None
            transport._closing = True  # nothing left for it to close or warn of
    conn._parser.on_disconnect()
    conn._reader = None
    conn._writer = None


class TimedConnection(Connection):
    """A TCP connection (``redis://``) with its writes bounded by a timeout scope."""

    async def connect(self) -> None:
        await _drop_if_closed(self)
        connect: Any = super().connect
        await connect()

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        await _send(self, super().send_packed_command, command, check_health)


class TimedSSLConnection(SSLConnection):
    """A TLS connection (``rediss://``) with its writes bounded by a timeout scope."""

    async def connect(self) -> None:
        await _drop_if_closed(self)
        connect: Any = super().connect
        await connect()

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        await _send(self, super().send_packed_command, command, check_health)


class TimedUnixConnection(UnixDomainSocketConnection):
    """A Unix-socket connection (``unix://``) with its writes bounded by a timeout scope."""

    async def connect(self) -> None:
        await _drop_if_closed(self)
        connect: Any = super().connect
        await connect()

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        await _send(self, super().send_packed_command, command, check_health)


#: redis-py's connection classes and ours.
TIMED: dict[type[AbstractConnection], type[AbstractConnection]] = {
    Connection: TimedConnection,
    SSLConnection: TimedSSLConnection,
    UnixDomainSocketConnection: TimedUnixConnection,
}


def with_timed_writes(client: Any) -> None:
    """Make the connections ``client``'s pool opens from now on ``TIMED`` ones (a pool of
    another connection class is left as it is)."""
    pool = client.connection_pool
    pool.connection_class = TIMED.get(pool.connection_class, pool.connection_class)


#: Connections a consuming process opens up front (``open_spares``): its lease acquires and
#: renewals go by the batcher's priority lane, several round trips at once, and should find
#: an idle connection, not open one: a new connection costs round trips of the leases'
#: margin (the connect, and redis-py's CLIENT SETINFO after it), in bursts.
SPARE_CONNECTIONS = 8
_spared: weakref.WeakSet[Any] = weakref.WeakSet()


async def open_spares(client: Any, n: int = SPARE_CONNECTIONS) -> None:
    """Open ``n`` connections of ``client``'s pool at once (best effort, once per client; a
    cluster client's pools are left to open on demand)."""
    if client in _spared or is_cluster(client):
        return
    _spared.add(client)
    await asyncio.gather(*(client.ping() for _ in range(n)), return_exceptions=True)
