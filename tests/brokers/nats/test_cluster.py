"""Past one server: a 3-node JetStream cluster (three local nats-server processes routed to
each other, on free ports), the queue's streams and buckets replicated (R3). Two worker
processes run jobs whose effect is a row under ``ctx.effect``; one node is SIGKILLed
mid-run and restarted: 0 lost, 0 applied twice, and the workers reconnect by themselves."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
import uuid
from pathlib import Path

import asyncpg
import nats
import pytest

import aqw
from aqw.idempotency import SqlCompletionStore
from aqw.job import Job
from tests._helpers import eventually
from tests._spawn import Forked, spawn_script

from .chaos_worker import DSN
from .conftest import cluster_of_three

# Three servers and several workers: one such test at a time (CONTRIBUTING.md).
# nats-py, reconnecting from a server killed under it, can leave the dead connection's socket
# for the garbage collector (a ResourceWarning raised later, in whatever test runs then):
# the client's, not aqw's; every other test keeps warnings as errors.
RECONNECT_LEAK = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.xdist_group("processes"),
    RECONNECT_LEAK,
]

HERE = Path(__file__).parent
JOBS = 1000


async def _ready(url: str) -> bool:
    """JetStream of the cluster answers and places a stream on all three nodes (a meta leader
    is elected and every peer has joined it)."""
    with contextlib.suppress(Exception):
        nc = await nats.connect(url, max_reconnect_attempts=0, connect_timeout=1)
        try:
            js = nc.jetstream(timeout=2)
            name = f"READY_{uuid.uuid4().hex[:8]}"
            await js.add_stream(name=name, subjects=[f"ready.{name}"], num_replicas=3)
            await js.delete_stream(name)
            return True
        finally:
            await nc.close()
    return False


async def test_a_node_killed_and_restarted_loses_nothing_and_applies_nothing_twice(
    tmp_path: Path,
) -> None:
    if shutil.which("nats-server") is None:
        pytest.skip("no nats-server on PATH")
    nodes = cluster_of_three(tmp_path)
    for node in nodes:
        node.start()
    url = "nats://" + ",".join(f"127.0.0.1:{n.port}" for n in nodes)
    queue = f"r3-{uuid.uuid4().hex[:8]}"
    table = f"nats_r3_{uuid.uuid4().hex[:8]}"
    db = await asyncpg.connect(DSN)
    await SqlCompletionStore().ensure_schema(db)
    await db.execute(f"CREATE TABLE {table} (job_id text, n int, fence bigint)")
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[2])}
    procs: list[Forked] = []
    try:
        await eventually(lambda: _ready(nodes[0].url), 60, "the cluster's JetStream", interval=0.5)
        producer = aqw.App(f"{url}?queue={queue}&ack_wait=3&replicas=3")
        jobs = [Job(task="apply", payload=n) for n in range(JOBS)]
        for start in range(0, JOBS, 250):
            await producer.broker.publish(jobs[start : start + 250])
        await producer.broker.close()
        with (tmp_path / "workers.log").open("ab") as log:
            for _ in range(2):
                procs.append(
                    await spawn_script(
                        HERE / "chaos_worker.py", url, queue, table, "&replicas=3", log=log, env=env
                    )
                )

        async def applied() -> int:
            return int(await db.fetchval(f"SELECT count(DISTINCT job_id) FROM {table}"))

        await eventually(lambda: _some(applied), 60, "the workers start applying", interval=0.1)
        nodes[1].kill()  # SIGKILL, mid-run
        await asyncio.sleep(2.0)
        nodes[1].start()
        killed_at = time.monotonic()

        async def done() -> bool:
            return await applied() >= JOBS

        await eventually(done, 120, f"all {JOBS} jobs applied", interval=0.2)
        print(f"drained {time.monotonic() - killed_at:.1f}s after the restart")
        for proc in procs:
            assert proc.returncode is None  # the workers reconnected by themselves
        twice = await db.fetch(f"SELECT job_id FROM {table} GROUP BY job_id HAVING count(*) > 1")
        assert twice == []
        ids = {r["job_id"] for r in await db.fetch(f"SELECT job_id FROM {table}")}
        assert ids == {j.id for j in jobs}
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
        for node in nodes:
            node.kill()
        await db.execute(f"DROP TABLE {table}")
        await db.execute("DELETE FROM aqw_completions WHERE queue = $1", queue)
        await db.execute("DELETE FROM aqw_fences WHERE queue = $1", queue)
        await db.close()


async def _some(count: object) -> bool:
    assert callable(count)
    return bool(await count() > JOBS // 10)
