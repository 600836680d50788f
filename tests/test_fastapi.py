"""The FastAPI embedding: ``aqw.fastapi.lifespan`` and ``examples/fastapi_app.py``.

In process (``asgi_lifespan.LifespanManager`` + ``httpx.ASGITransport``) on ``memory://``, and
under a real uvicorn server on the real Redis: enqueue, status with progress, health, and
SIGTERM while jobs run: every job then either completed or waits in the stream for
redelivery, none is left pending or lost.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import redis
from asgi_lifespan import LifespanManager
from conftest import REDIS_URL

import aqw
from aqw.brokers.memory import MemoryBroker
from aqw.fastapi import health, lifespan, worker_of
from tests._helpers import free_port

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "fastapi_app.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("aqw_example_fastapi_app", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def poll(
    client: httpx.AsyncClient, path: str, pred: Callable[[httpx.Response], bool], within: float
) -> httpx.Response:
    deadline = time.monotonic() + within
    while True:
        response = await client.get(path)
        if pred(response):
            return response
        if time.monotonic() > deadline:
            raise AssertionError(f"GET {path}: gave up after {within}s at {response.text}")
        await asyncio.sleep(0.02)


# -- in process, memory:// -----------------------------------------------------------------------


@pytest.fixture
async def asgi(queue_name: str) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    api = load_example().create_app("memory://", queue_name)
    async with LifespanManager(api, startup_timeout=10, shutdown_timeout=10) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield api, client


async def test_in_process_enqueue_status_health(asgi: tuple[Any, httpx.AsyncClient]) -> None:
    api, client = asgi
    worker = worker_of(api)
    assert worker.state == "running"
    r = await client.get("/health")
    assert r.status_code == 200
    assert r.json()["state"] == "running" and r.json()["ok"] is True

    for bad in ({}, {"name": ""}, {"name": "x", "seconds": -1}, {"name": "x", "steps": "many"}):
        r = await client.post("/jobs", json=bad)
        assert r.status_code == 422, bad
    assert (await api.state.jobs.broker.depth()).waiting == 0

    r = await client.post("/jobs", json={"name": "q3", "seconds": 0.6, "steps": 3})
    assert r.status_code == 202
    job_id = r.json()["job_id"]
    running = await poll(
        client, f"/jobs/{job_id}", lambda r: r.json().get("progress", 0) > 0, within=5
    )
    body = running.json()
    assert body["state"] == "running" and 0 < body["progress"] < 1
    assert body["message"].startswith("step ")
    result = await client.get(f"/jobs/{job_id}/result", params={"wait": 5})
    assert result.status_code == 200 and result.json()["name"] == "q3"
    done = (await client.get(f"/jobs/{job_id}")).json()
    assert done["state"] == "succeeded" and done["result"]["name"] == "q3"
    assert done["progress"] == 1.0 and done["attempts"] == 1

    assert (await client.get("/jobs/nope")).status_code == 404
    assert (await client.get("/jobs/nope/result")).status_code == 404
    assert (await client.get(f"/jobs/{job_id}/result", params={"wait": 0})).status_code == 422
    r = await client.get("/health")
    assert r.json()["processed"] == 1 and r.json()["in_flight"] == 0
    assert r.json()["uptime"] > 0


async def test_in_process_cancel_and_wait(asgi: tuple[Any, httpx.AsyncClient]) -> None:
    _, client = asgi
    r = await client.post("/jobs", json={"name": "long", "seconds": 30, "steps": 30})
    job_id = r.json()["job_id"]
    await poll(client, f"/jobs/{job_id}", lambda r: r.json()["state"] == "running", within=5)
    waited = await client.get(f"/jobs/{job_id}/result", params={"wait": 0.2})
    assert waited.status_code == 504
    r = await client.delete(f"/jobs/{job_id}")
    assert r.status_code == 202 and r.json()["outcome"] == "cancelling"
    ended = await client.get(f"/jobs/{job_id}/result", params={"wait": 15})
    assert ended.status_code == 409 and "cancelled" in ended.json()["detail"]
    assert (await client.get(f"/jobs/{job_id}")).json()["state"] == "cancelled"
    again = await client.delete(f"/jobs/{job_id}")
    assert again.json()["outcome"] == "finished"
    assert (await client.delete("/jobs/nope")).status_code == 404


async def test_in_process_idempotency_key(asgi: tuple[Any, httpx.AsyncClient]) -> None:
    _, client = asgi
    body = {"name": "once", "seconds": 0}
    first = await client.post("/jobs", json=body, headers={"Idempotency-Key": "k1"})
    again = await client.post("/jobs", json=body, headers={"Idempotency-Key": "k1"})
    assert first.json()["job_id"] == again.json()["job_id"]
    assert again.json()["duplicate"] is True


async def test_lifespan_shutdown_hands_back_unfinished_jobs(queue_name: str) -> None:
    jobs = aqw.App(MemoryBroker(queue_name))
    started = asyncio.Event()

    @jobs.task
    async def slow() -> None:
        started.set()
        await asyncio.sleep(30)

    class Web:  # any object with a ``state`` namespace works, FastAPI or not
        class state:
            pass

    web = Web()
    async with lifespan(jobs, concurrency=2, grace=0.1)(web):
        worker = worker_of(web)
        await slow.enqueue()
        await asyncio.wait_for(started.wait(), 5)
        assert health(worker)["in_flight"] == 1
    assert worker.state == "stopped"
    assert health(worker)["ok"] is False
    depth = await jobs.broker.depth()
    assert (depth.waiting, depth.in_flight) == (1, 0)  # handed back, not lost


def test_lifespan_validates_and_worker_of_explains() -> None:
    with pytest.raises(aqw.ConfigError):
        lifespan(aqw.App(), concurrency=0)

    class Web:
        class state:
            pass

    with pytest.raises(aqw.ConfigError, match="lifespan"):
        worker_of(Web())


# -- a real uvicorn server on the real Redis -----------------------------------------------------


class Server:
    """``uvicorn fastapi_app:app`` in a subprocess on a free loopback port."""

    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.log = tmp_path / f"uvicorn-{self.port}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "fastapi_app:app",
                    "--app-dir",
                    str(EXAMPLE.parent),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--log-level",
                    "info",
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 20
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"uvicorn exited {self.proc.returncode}: {self.output()}")
            try:
                if httpx.get(self.base + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"uvicorn did not come up: {self.output()}")
            time.sleep(0.05)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def server_factory(
    tmp_path: Path, queue_name: str, subprocess_env: dict[str, str]
) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []
    client = redis.Redis.from_url(REDIS_URL)

    def start(**env: str) -> Server:
        server_env = dict(subprocess_env)
        server_env.update(AQW_BROKER=REDIS_URL, AQW_QUEUE=queue_name, AQW_CONCURRENCY="4")
        server_env.update(env)
        server = Server(tmp_path, server_env)
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()
        for key in list(client.scan_iter(match=f"example:{{{queue_name}}}:*", count=1000)):
            client.delete(key)
        client.close()  # the queue's aqw:{q}:* keys go with the queue_name fixture


@pytest.mark.redis
async def test_uvicorn_enqueue_status_health(server_factory: Callable[..., Server]) -> None:
    server = server_factory()
    async with httpx.AsyncClient(base_url=server.base, timeout=5) as client:
        r = await client.post("/jobs", json={"name": "q3", "seconds": "soon"})
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["body", "seconds"]

        r = await client.post("/jobs", json={"name": "q3", "seconds": 1.0, "steps": 4})
        assert r.status_code == 202
        job_id = r.json()["job_id"]
        running = await poll(
            client, f"/jobs/{job_id}", lambda r: r.json().get("progress", 0) > 0, within=10
        )
        assert running.json()["state"] == "running"
        assert running.json()["worker"]
        result = await client.get(f"/jobs/{job_id}/result", params={"wait": 10}, timeout=15)
        assert result.status_code == 200 and result.json()["name"] == "q3"
        done = (await client.get(f"/jobs/{job_id}")).json()
        assert done["state"] == "succeeded" and done["result"]["name"] == "q3"
        assert (await client.get("/jobs/0123456789abcdef")).status_code == 404
        h = (await client.get("/health")).json()
        assert h["state"] == "running" and h["processed"] == 1 and h["concurrency"] == 4
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(15) in (0, -signal.SIGTERM)


def stream_job_ids(client: redis.Redis, queue: str) -> list[str]:
    entries: Any = client.xrange(f"aqw:{{{queue}}}:stream")
    return [json.loads(fields[b"j"])["id"] for _, fields in entries]


@pytest.mark.redis
@pytest.mark.parametrize("grace", ["10", "0.2"], ids=["jobs-finish", "jobs-handed-back"])
async def test_uvicorn_sigterm_loses_nothing(
    server_factory: Callable[..., Server], queue_name: str, grace: str
) -> None:
    """SIGTERM with jobs running: with a long grace the running ones finish, with a short
    one they are handed back; either way every job is completed or waits in the stream,
    and none is left pending on a consumer that is gone."""
    server = server_factory(AQW_GRACE=grace)
    async with httpx.AsyncClient(base_url=server.base, timeout=5) as client:
        ids = []
        for i in range(10):
            r = await client.post("/jobs", json={"name": f"r{i}", "seconds": 1.0, "steps": 2})
            assert r.status_code == 202
            ids.append(r.json()["job_id"])
        await poll(client, "/health", lambda r: r.json()["in_flight"] == 4, within=10)
    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(20)
    assert code in (0, -signal.SIGTERM), server.output()

    client = redis.Redis.from_url(REDIS_URL)
    try:
        states = {i: client.hget(f"aqw:{{{queue_name}}}:job:{i}", "state") for i in ids}
        completed = {i for i, state in states.items() if state == b"succeeded"}
        waiting = stream_job_ids(client, queue_name)
        pending: Any = client.xpending(f"aqw:{{{queue_name}}}:stream", "aqw")
    finally:
        client.close()
    assert pending["pending"] == 0, "a job was left pending on the stopped worker"
    assert len(waiting) == len(set(waiting)), "a job was duplicated in the stream"
    assert set(ids) == completed | set(waiting), "a job was lost"
    if grace == "10":
        assert len(completed) >= 4, "the running jobs should have finished within the grace"
        assert not completed & set(waiting)
    else:
        assert not completed, "jobs of 1s cannot finish within a 0.2s grace"
        assert "cancelling 4 jobs" in server.output()
