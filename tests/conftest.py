"""Shared fixtures: brokers on three backends, the real Redis, throwaway redis-servers.

Every test works in its own queue (``t-<8 hex>``); keys written to the shared Redis
(``AQW_TEST_REDIS_URL``, by default 127.0.0.1:6379 db 0) are all under ``aqw:{<queue>}:*`` and
are deleted with SCAN + DEL at the end of the test. Never FLUSHDB / FLUSHALL: other tests and
people share that server.

A test that needs the real server (the ``redis`` parameter or the ``redis`` marker) FAILS
with a clear message when it does not answer: CI starts Redis, so a missing server is an
error to see, not a reason to skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
from redis.asyncio import Redis

import aqw
from aqw.brokers.memory import MemoryBroker, reset_memory_queues
from aqw.brokers.redis import PartitionedBroker, RedisBroker
from tests._helpers import (
    REDIS_URL,
    free_port,
    real_redis_answers,
    redis_pings,
    require_real_redis,
)

BACKENDS = ["memory", "fakeredis", pytest.param("redis", marks=pytest.mark.redis)]
#: Partitions of a ``<kind>-partitioned`` backend's queue.
PARTITIONS = 3
REDIS_BACKENDS = ["fakeredis", pytest.param("redis", marks=pytest.mark.redis)]


# -- the shared real server --------------------------------------------------------------------


def delete_queue_keys(queues: list[str]) -> None:
    """SCAN and DEL every ``aqw:{queue}:*`` key of the given queues on the real server."""
    if not queues or not real_redis_answers(0.5):
        return
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=5)
    try:
        for queue in queues:  # the queue's keys, and its partitions' (``aqw:{q:i}:*``)
            batch = list(client.scan_iter(match=f"aqw:{{{queue}}}:*", count=1000))
            batch += client.scan_iter(match=f"aqw:{{{queue}:*}}:*", count=1000)
            for i in range(0, len(batch), 500):
                client.delete(*batch[i : i + 500])
    finally:
        client.close()


@pytest.fixture
def redis_url() -> str:
    """URL of the real Redis (``AQW_TEST_REDIS_URL``); fails the test when it does not answer."""
    require_real_redis()
    return REDIS_URL


@pytest.fixture(autouse=True)
def _marked_redis(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("redis") is not None:
        require_real_redis()


@pytest.fixture
def queue_names() -> Iterator[Callable[[], str]]:
    """A factory of unique queue names; their keys are deleted from the real Redis at the end."""
    made: list[str] = []

    def new() -> str:
        name = f"t-{uuid.uuid4().hex[:8]}"
        made.append(name)
        return name

    yield new
    delete_queue_keys(made)


@pytest.fixture
def queue_name(queue_names: Callable[[], str]) -> str:
    return queue_names()


@pytest.fixture(autouse=True)
def _fresh_memory_queues() -> Iterator[None]:
    reset_memory_queues()
    yield
    reset_memory_queues()


# -- brokers on three backends ------------------------------------------------------------------


class Backend:
    """Apps on one backend, all on the same queue unless told otherwise.

    ``raw`` is a plain async client on the same data (None for the memory broker), for
    inspecting keys and writing raw stream entries.
    """

    def __init__(self, kind: str, queue: str) -> None:
        self.kind = kind
        self.queue = queue
        #: ``<kind>-partitioned``: the queue spread over ``PARTITIONS`` streams.
        self.partitioned = kind.endswith("-partitioned")
        self.store = kind.removesuffix("-partitioned")  # memory, fakeredis or redis
        self.apps: list[aqw.App] = []
        self._clients: list[Redis] = []
        self._server = fakeredis.FakeServer() if self.store == "fakeredis" else None
        self.raw: Redis | None = None
        if kind != "memory":
            self.raw = self.client()

    @property
    def is_redis(self) -> bool:
        return self.kind != "memory"

    def client(self) -> Redis:
        """A new async client on this backend's data (closed at teardown)."""
        client: Redis
        if self.store == "fakeredis":
            client = fakeredis.FakeAsyncRedis(server=self._server)
        elif self.store == "redis":
            client = Redis.from_url(REDIS_URL)
        else:
            raise RuntimeError("the memory backend has no Redis client")
        self._clients.append(client)
        return client

    def broker(self, queue: str | None = None) -> aqw.Broker:
        queue = queue or self.queue
        if self.partitioned:
            where: Redis | str = self.client() if self.store == "fakeredis" else REDIS_URL
            return PartitionedBroker(where, queue, PARTITIONS)
        if self.kind == "memory":
            return MemoryBroker(queue)
        if self.kind == "fakeredis":
            return RedisBroker(self.client(), queue)
        return RedisBroker(REDIS_URL, queue)  # owns its client, as `App("redis://...")` does

    def app(self, queue: str | None = None, **options: Any) -> aqw.App:
        app = aqw.App(self.broker(queue), **options)
        self.apps.append(app)
        return app

    async def aclose(self) -> None:
        for app in self.apps:
            await app.close()
        for client in self._clients:
            await client.aclose()


@contextlib.asynccontextmanager
async def open_backend(kind: str, queue: str) -> AsyncIterator[Backend]:
    """A ``Backend`` of ``kind`` on ``queue``, its apps and clients closed afterwards."""
    if kind.startswith("redis"):
        require_real_redis()
    b = Backend(kind, queue)
    try:
        yield b
    finally:
        await b.aclose()


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, queue_name: str) -> AsyncIterator[Backend]:
    """The same tests on the in-process broker, on fakeredis and on the real Redis."""
    async with open_backend(request.param, queue_name) as b:
        yield b


@pytest.fixture(params=REDIS_BACKENDS)
async def redis_backend(request: pytest.FixtureRequest, queue_name: str) -> AsyncIterator[Backend]:
    """Like ``backend``, on fakeredis and the real Redis only (tests of Redis scripts)."""
    async with open_backend(request.param, queue_name) as b:
        yield b


@pytest.fixture
def app_factory(backend: Backend) -> Callable[..., aqw.App]:
    """``app_factory(**App options)``: a new App (and broker) on the test's backend and queue."""
    return backend.app


@pytest.fixture
def broker_url(backend: Backend) -> str | None:
    """The backend's URL (None for fakeredis, which has no URL)."""
    return {"memory": f"memory://{backend.queue}", "redis": REDIS_URL}.get(backend.kind)


@pytest.fixture(params=REDIS_BACKENDS)
async def redis_clients(
    request: pytest.FixtureRequest, queue_names: Callable[[], str]
) -> AsyncIterator[Callable[[], Redis]]:
    """A factory of async clients on one data set: fakeredis, or the real Redis.

    Every client made is closed at teardown, before the test's queue keys are deleted
    (hence the dependency on ``queue_names``)."""
    made: list[Redis] = []
    server = fakeredis.FakeServer()
    if request.param == "redis":
        require_real_redis()

    def new() -> Redis:
        client: Redis
        if request.param == "redis":
            # redis-py 8 fails a pool's 101st command at once: lease tests run more
            # contenders than that on one client (aqw's own clients are unbounded)
            client = Redis.from_url(REDIS_URL, max_connections=1000)
        else:
            client = fakeredis.FakeAsyncRedis(server=server, max_connections=1000)
        made.append(client)
        return client

    try:
        yield new
    finally:
        for client in made:
            await client.aclose()


@pytest.fixture
def lease_redis(redis_clients: Callable[[], Redis]) -> Redis:
    """An async client on fakeredis or on the real Redis, for lease tests."""
    return redis_clients()


# -- throwaway redis-servers -------------------------------------------------------------------


class PrivateRedis:
    """One redis-server process on a free loopback port, that a test may kill or restart."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not on PATH", pytrace=False)
        for _ in range(5):  # the free port can be taken between probe and bind: try another
            self.proc = subprocess.Popen(
                [
                    binary,
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(self.workdir),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + 10
            while self.proc.poll() is None and time.monotonic() < deadline:
                if redis_pings(self.port):
                    return
                time.sleep(0.02)
            self.kill()
            self.port = free_port()
        pytest.fail("a private redis-server did not start")

    def kill(self) -> None:
        """SIGKILL the server (no goodbye to clients) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A private redis-server (never the shared one) for tests that kill or cut Redis."""
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.fixture
def subprocess_env(repo_root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo_root), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
