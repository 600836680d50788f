"""The Redis client aqw builds from a URL: bounded writes without a task per command
(``aqw/_redis/connections.py``), a read bound that still holds, and the URL options aqw
takes off (``?queue=``, ``?partitions=``)."""

from __future__ import annotations

import asyncio
import socket
import sys
import uuid
from typing import Any

import pytest
import redis.exceptions
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection

from aqw._redis.client import make_client, split_option, split_queue
from aqw._redis.connections import (
    TimedConnection,
    TimedSSLConnection,
    TimedUnixConnection,
    _send,
)
from tests._helpers import REDIS_URL

pytestmark = pytest.mark.timeout(30)

#: How long the stuck write of the tests below would take without a bound (seconds).
STUCK_WRITE = 10.0


class Conn:
    socket_timeout: float | None = 0.2


async def test_a_stuck_write_times_out_and_the_bound_is_restored() -> None:
    conn = Conn()
    seen: list[float | None] = []

    async def stuck(command: Any, check_health: bool) -> None:
        seen.append(conn.socket_timeout)  # redis-py's own bound is off while it writes
        await asyncio.sleep(STUCK_WRITE)

    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(redis.exceptions.TimeoutError, match="writing"):
        await _send(conn, stuck, b"PING", True)
    took = loop.time() - started
    # cut by the connection's own 0.2 s bound: not before it, nor by the write's 10 s
    assert conn.socket_timeout <= took < STUCK_WRITE, took
    assert seen == [None] and conn.socket_timeout == 0.2


async def _swallowed(send_with: Any) -> tuple[int, int]:
    """(cancels that landed, cancels swallowed) over writes that end one turn after they
    start, cancelled 0 to 3 turns in."""
    conn = Conn()
    writing = asyncio.Event()

    async def quick(command: Any, check_health: bool) -> None:
        writing.set()
        await asyncio.sleep(0)

    landed = swallowed = 0
    for turns in range(4):
        for _ in range(25):
            writing.clear()
            task = asyncio.create_task(send_with(conn, quick, b"PING", True))
            await writing.wait()
            for _ in range(turns):
                await asyncio.sleep(0)
            if task.cancel():
                landed += 1
                try:
                    await task
                    swallowed += 1
                except asyncio.CancelledError:
                    pass
            assert conn.socket_timeout == 0.2
    return landed, swallowed


async def test_a_cancel_during_a_write_is_not_swallowed() -> None:
    """redis-py's ``asyncio.wait_for`` (Python 3.11) swallows a cancel that lands as the
    write completes; the timeout scope lets every one through."""
    landed, swallowed = await _swallowed(_send)
    assert landed >= 25 and swallowed == 0
    if sys.version_info < (3, 12):  # the same writes under wait_for: the case is real

        async def wait_for(conn: Any, send: Any, command: Any, check_health: bool) -> None:
            await asyncio.wait_for(send(command, check_health), conn.socket_timeout)

        assert (await _swallowed(wait_for))[1] > 0


async def test_a_client_from_a_url_uses_timed_connections_and_works() -> None:
    client = make_client(REDIS_URL)
    try:
        assert client.connection_pool.connection_class is TimedConnection
        assert await client.ping()
        conn: Any = await client.connection_pool.get_connection()
        try:
            assert isinstance(conn, TimedConnection) and conn.socket_timeout
        finally:
            await client.connection_pool.release(conn)
        pipe = client.pipeline(transaction=False)
        for i in range(200):  # a pipeline bigger than one write
            pipe.echo(b"x" * 1000 + str(i).encode())
        assert len(await pipe.execute()) == 200
    finally:
        await client.aclose()
    assert make_client("rediss://127.0.0.1:1/0").connection_pool.connection_class is (
        TimedSSLConnection
    )
    unix = make_client("unix:///tmp/none.sock").connection_pool.connection_class
    assert unix is TimedUnixConnection
    assert issubclass(TimedSSLConnection, SSLConnection)
    assert issubclass(TimedUnixConnection, UnixDomainSocketConnection)


async def test_more_commands_at_once_than_a_default_pool_holds_all_run() -> None:
    """redis-py 8 bounds a pool at 100 connections and fails the next command at once; a
    burst of awaited enqueues or polling lock contenders on aqw's client must not fail."""
    client = make_client(REDIS_URL)
    try:
        key = f"aqw-test-none-{uuid.uuid4().hex}"
        replies = await asyncio.gather(*(client.blpop([key], 0.2) for _ in range(250)))
        assert replies == [None] * 250
    finally:
        await client.aclose()


async def test_a_server_that_never_answers_still_times_out_the_read() -> None:
    with socket.socket() as listener:  # accepts, reads nothing, answers nothing
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = make_client(f"redis://127.0.0.1:{port}/0", socket_timeout=0.3)
        # redis-py's errors, not asyncio.wait_for's: its own read timeout ended the wait
        with pytest.raises((redis.exceptions.TimeoutError, redis.exceptions.ConnectionError)):
            await asyncio.wait_for(client.ping(), 60)
        await client.aclose()


def test_options_are_taken_off_the_url() -> None:
    assert split_queue("redis://h:1/0?queue=q&partitions=3", "d") == (
        "redis://h:1/0?partitions=3",
        "q",
    )
    assert split_option("redis://h:1/0?partitions=3&x=a%2Bb", "partitions") == (
        "redis://h:1/0?x=a%2Bb",
        "3",
    )
    assert split_option("redis://h:1/0", "partitions") == ("redis://h:1/0", None)
