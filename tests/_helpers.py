"""Small helpers shared by the tests: waiting, running workers, looking inside a Redis queue,
writing raw messages, and the servers the tests talk to (the real Redis, moto)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest
import redis

import aqw
from aqw.brokers.base import Broker
from aqw.brokers.memory import MemoryBroker
from aqw.brokers.redis import RedisBroker

if TYPE_CHECKING:
    from conftest import Backend

#: The shared Redis the tests use: ``AQW_TEST_REDIS_URL``, by default db 0 on 127.0.0.1:6379.
#: Its host, port and db are derived from the URL wherever a test needs them apart.
REDIS_URL = os.environ.get("AQW_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"
_REDIS = urllib.parse.urlsplit(REDIS_URL)
REDIS_HOST = _REDIS.hostname or "127.0.0.1"
REDIS_PORT = _REDIS.port or 6379
REDIS_DB = int(_REDIS.path.lstrip("/") or 0)


def redis_url_db(db: int) -> str:
    """The URL of another database (``db``) on the shared Redis server."""
    return urllib.parse.urlunsplit(_REDIS._replace(path=f"/{db}"))


#: The PostgreSQL the tests use: ``AQW_TEST_PG_DSN``. Unset, the DSNs tried in turn are those of
#: user ``postgres``, then ``root``, without a password on 127.0.0.1:5432, database ``test``.
PG_DSNS: tuple[str, ...] = (
    (os.environ["AQW_TEST_PG_DSN"],)
    if os.environ.get("AQW_TEST_PG_DSN")
    else tuple(f"postgresql://{user}@127.0.0.1:5432/test" for user in ("postgres", "root"))
)


def pg_where(dsn: str) -> str:
    """``host:port/db`` of a DSN, without its user or password, for messages."""
    parts = urllib.parse.urlsplit(dsn)
    return f"{parts.hostname}:{parts.port or 5432}{parts.path}"


# -- waiting -----------------------------------------------------------------------------------


class _Process(Protocol):
    pid: int

    @property
    def returncode(self) -> int | None: ...


async def eventually(
    pred: Callable[[], Any],
    within: float,
    what: str,
    *,
    interval: float = 0.01,
    procs: Sequence[_Process] = (),
    allowed_exits: Collection[int] = (),
) -> Any:
    """Poll ``pred`` (plain or async) every ``interval`` seconds until it returns a truthy
    value, and return that value; fail after ``within`` seconds. With ``procs``, fail at once
    when one of those processes has exited, unless with a code in ``allowed_exits``."""
    deadline = time.monotonic() + within
    while True:
        value = pred()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        for proc in procs:
            code = proc.returncode
            if code is not None and code not in allowed_exits:
                raise AssertionError(f"worker {proc.pid} exited early with {code}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(interval)


def ttl_agrees(pttl_ms: int, ttl_ms: float, since: float) -> bool:
    """Whether a key's ``PTTL`` reading agrees with a TTL of ``ttl_ms`` set after ``since`` (a
    ``time.monotonic()`` taken before the write), however long the machine took in between:
    the key has a TTL, no longer than ``ttl_ms`` and no shorter than what is left of it after
    the time that has passed; or it is gone (-2), and then only once ``ttl_ms`` has passed."""
    passed_ms = (time.monotonic() - since) * 1000
    slack_ms = 5  # Redis rounds to the millisecond, and reads the wall clock
    if pttl_ms == -2:
        return passed_ms + slack_ms >= ttl_ms
    return ttl_ms - passed_ms - slack_ms <= pttl_ms <= ttl_ms


# -- workers -----------------------------------------------------------------------------------


async def run_burst(app: aqw.App, within: float = 20.0, **options: Any) -> aqw.Worker:
    """Run a burst worker (it stops when the queue is empty) of ``app``, within a bound."""
    worker = app.worker(burst=True, **options)
    await asyncio.wait_for(worker.run(), within)
    assert worker.state == "stopped"
    return worker


async def stop_all(*workers: aqw.Worker, within: float = 20.0) -> None:
    """Stop workers, failing clearly (not by the test timeout) if a stop hangs."""
    try:
        await asyncio.wait_for(asyncio.gather(*(w.stop() for w in workers)), within)
    except TimeoutError:
        raise AssertionError(f"Worker.stop() did not return within {within}s") from None


@contextlib.asynccontextmanager
async def running(worker: aqw.Worker) -> AsyncIterator[aqw.Worker]:
    """Like ``async with worker:``, with a bounded stop."""
    await worker.start()
    try:
        yield worker
    finally:
        await stop_all(worker)


async def depth(app: aqw.App) -> tuple[int, int, int, int]:
    d = await app.broker.depth()
    return (d.waiting, d.in_flight, d.delayed, d.dead)


# -- inside a queue ----------------------------------------------------------------------------


async def assert_stream_empty(backend: Backend, app: aqw.App, *, delayed: bool = False) -> None:
    """On Redis: the stream and its pending list are empty (and, with ``delayed``, the delayed
    set too). The memory broker has nothing more to look at than ``depth()``."""
    if backend.raw is None:
        return
    broker = app.broker
    assert isinstance(broker, RedisBroker)
    assert await backend.raw.xlen(broker.keys.stream) == 0
    assert (await backend.raw.xpending(broker.keys.stream, "aqw"))["pending"] == 0
    if delayed:
        assert await backend.raw.zcard(broker.keys.delayed) == 0


async def publish_raw(
    backend: Backend, target: aqw.App | Broker, fields: dict[str, bytes] | bytes
) -> None:
    """Write a message as a foreign producer would: on Redis a raw XADD of exactly ``fields``
    (bytes: the ``j`` field alone); the memory broker keeps only the ``j`` bytes."""
    broker = target.broker if isinstance(target, aqw.App) else target
    if isinstance(fields, bytes):
        fields = {"j": fields}
    if isinstance(broker, MemoryBroker):
        await broker.publish_raw(fields["j"])
        return
    assert isinstance(broker, RedisBroker) and backend.raw is not None
    await backend.raw.xadd(broker.keys.stream, dict(fields))  # type: ignore[arg-type]


# -- servers -----------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (never the shared 6379)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    assert port != REDIS_PORT
    return port


def redis_pings(port: int) -> bool:
    """True when a Redis server on 127.0.0.1:``port`` answers PING."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def real_redis_answers(timeout: float = 1.0) -> bool:
    """True when the shared Redis (``REDIS_URL``) answers PING."""
    try:
        client = redis.Redis.from_url(
            REDIS_URL, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        try:
            return bool(client.ping())
        finally:
            client.close()
    except redis.RedisError:
        return False


def require_real_redis() -> None:
    """Fail (never skip) when the real Redis (``REDIS_URL``) is not answering."""
    if not real_redis_answers():
        pytest.fail(
            f"the real Redis server at {REDIS_HOST}:{REDIS_PORT} (db {REDIS_DB}) is not answering "
            "PING. These tests need it (CI starts one; locally: `redis-server --daemonize yes`, "
            "or point AQW_TEST_REDIS_URL at one).",
            pytrace=False,
        )


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """A moto server (SQS and the other AWS APIs) on a free loopback port, in a process of
    its own (``tests/_moto_proc.py``); its endpoint URL."""
    script = Path(__file__).with_name("_moto_proc.py")
    server = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        if not port.isdigit():
            raise RuntimeError(f"the moto server did not start (exit code {server.wait(10)})")
        yield f"http://127.0.0.1:{port}"
    finally:
        assert server.stdin is not None and server.stdout is not None
        server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        server.stdout.close()
