"""Batches through a Redis restart: a redis-server of the test's own (AOF, fsync always) is
SIGKILLed and started again while a worker drains 5 batches of 40 children. Every batch
completes with every child counted once and one callback job each: the counts and the
callbacks' idempotency keys are in the server's state, written in the steps themselves."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import aqw
from aqw.brokers.batching import callback_key
from aqw.brokers.redis import RedisBroker
from tests._helpers import eventually, free_port, redis_pings

pytestmark = pytest.mark.timeout(120)

BATCHES, CHILDREN = 5, 40


class AofRedis:
    """A redis-server on a free loopback port whose every write is fsynced to its AOF."""

    def __init__(self, workdir: Path) -> None:
        self.workdir, self.port = workdir, free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not on PATH", pytrace=False)
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 15
        while not redis_pings(self.port):
            assert self.proc.poll() is None, "the redis-server exited"
            assert time.monotonic() < deadline, "the redis-server did not answer"
            time.sleep(0.02)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def aof_redis(tmp_path: Path) -> Iterator[AofRedis]:
    server = AofRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


async def test_batches_complete_once_through_a_redis_restart(aof_redis: AofRedis) -> None:
    app = aqw.App(f"redis://127.0.0.1:{aof_redis.port}/0", queue="restart", lease_ttl=2.0)
    ran: list[str] = []
    callbacks: list[tuple[str, str]] = []

    @app.task(name="child")
    async def child(n: int, ctx: aqw.Context) -> None:
        await asyncio.sleep(0.01)
        ran.append(ctx.job_id)

    @app.task(name="done")
    async def done(ctx: aqw.Context) -> None:
        assert ctx.batch is not None
        callbacks.append((ctx.batch.id, ctx.job_id))

    ids = []
    for _ in range(BATCHES):
        async with app.batch(on_complete=done) as batch:
            await batch.enqueue_many(child, list(range(CHILDREN)))
        ids.append(batch.id)
    try:
        async with app.worker(concurrency=8, heartbeat=0.5):
            await eventually(lambda: len(ran) >= BATCHES * CHILDREN // 3, 30, "a third run")
            aof_redis.kill()  # mid-drain: children running, settles on their way
            await asyncio.sleep(0.5)
            aof_redis.start()

            async def all_complete() -> bool:
                infos = [await app.batch_info(b) for b in ids]
                return (
                    all(i is not None and i.state == "complete" for i in infos)
                    and len({b for b, _ in callbacks}) == BATCHES
                )

            await eventually(all_complete, 60, "every batch complete after the restart")
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        for batch_id in ids:
            info = await app.batch_info(batch_id)
            assert info is not None
            assert (info.total, info.succeeded, info.pending) == (CHILDREN, CHILDREN, 0)
            (job_id,) = {j for b, j in callbacks if b == batch_id}  # one callback job
            assert info.callbacks == {"complete": job_id}
            key = broker.keys.idempotency(callback_key(batch_id, "complete"))
            assert (await broker.client.get(key)) in (job_id, job_id.encode())
        assert len(set(ran)) == BATCHES * CHILDREN
    finally:
        await app.close()
