"""The NATS broker's tests: the shared JetStream server on 127.0.0.1:4222 (a fresh queue per
test, its streams and buckets deleted afterwards), and a private ``nats-server -js`` on a
free port for the tests that kill or restart it."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

import aqw
from aqw.brokers.nats import NatsBroker, Settings
from aqw.brokers.nats._layout import Layout

URL = "nats://127.0.0.1:4222"


def new_queue() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


async def drop_queue(queue: str, url: str = URL) -> None:
    """Delete everything queue ``queue`` made on the server."""
    names = Layout(queue)
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for stream in (names.stream, names.delayed_stream, names.dlq_stream):
            with contextlib.suppress(Exception):
                await js.delete_stream(stream)
        for kv in (
            names.leases_bucket,
            names.keys_bucket,
            names.state_bucket,
            names.records_bucket,
            names.depth_bucket,
        ):
            with contextlib.suppress(Exception):
                await js.delete_key_value(kv)
    finally:
        await nc.close()


@pytest.fixture
async def nats_queue() -> AsyncIterator[str]:
    queue = new_queue()
    yield queue
    await drop_queue(queue)


def broker(queue: str, url: str = URL, **settings: Any) -> NatsBroker:
    return NatsBroker(queue, [url], Settings(**settings))


class NatsBackend:
    """What the shared tests (priorities, rate limits, caps) ask of a backend, on one NATS
    queue (a 2 s ack window: a crashed consumer's deliveries come back within the test)."""

    kind = "nats"
    is_redis = False
    raw = None

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.apps: list[aqw.App] = []

    def broker(self, queue: str | None = None) -> NatsBroker:
        return broker(queue or self.queue, ack_wait=2.0)

    def app(self, queue: str | None = None, **options: Any) -> aqw.App:
        app = aqw.App(self.broker(queue), **options)
        self.apps.append(app)
        return app

    async def aclose(self) -> None:
        for app in self.apps:
            await app.close()


@pytest.fixture
async def backend() -> AsyncIterator[NatsBackend]:
    queue = new_queue()
    b = NatsBackend(queue)
    try:
        yield b
    finally:
        await b.aclose()
        await drop_queue(queue)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    """A private nats-server with JetStream (file store in ``store``)."""

    def __init__(self, store: Path, port: int | None = None, cluster: list[str] | None = None):
        self.store = store
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        #: For a node of a cluster: its options (name, cluster listen, routes).
        self.cluster = cluster or []

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = ["nats-server", "-js", "-a", "127.0.0.1", "-p", str(self.port)]
        self.proc = subprocess.Popen(
            [*cmd, "-sd", str(self.store), *self.cluster],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return
            time.sleep(0.05)
        raise RuntimeError("nats-server did not start")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture
def private_server(tmp_path: Path) -> Iterator[Server]:
    if shutil.which("nats-server") is None:
        pytest.skip("no nats-server on PATH")
    server = Server(tmp_path / "js")
    server.start()
    yield server
    server.kill()


def cluster_of_three(root: Path) -> list[Server]:
    """Three JetStream servers routed to each other on loopback (not started)."""
    ports = [free_port() for _ in range(3)]
    routes_ports = [free_port() for _ in range(3)]
    routes = ",".join(f"nats://127.0.0.1:{p}" for p in routes_ports)
    return [
        Server(
            root / f"n{i}",
            ports[i],
            [
                "-n",
                f"n{i}",
                "--cluster_name",
                "aqw",
                "--cluster",
                f"nats://127.0.0.1:{routes_ports[i]}",
                "--routes",
                routes,
            ],
        )
        for i in range(3)
    ]
