"""Chaos on JetStream: jobs enqueued on a private nats-server (file store), four worker
processes SIGKILLed again and again (each restarted) and the server itself SIGKILLed and
restarted twice, mid-run. Every job's effect is a row written under ``ctx.effect``: at the
end every job has exactly one row (0 lost, 0 applied twice) and the queue is drained.

``AQW_CHAOS_JOBS`` (default 2,000) and ``AQW_CHAOS_KILLS`` (default 20) scale it: the
issue's run is 10,000 jobs."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest

import aqw
from aqw.brokers.nats._repair import Repairer
from aqw.idempotency import SqlCompletionStore
from aqw.job import Job
from tests._helpers import eventually
from tests._spawn import Forked, spawn_script

from .chaos_worker import DSN
from .conftest import Server

# Several worker processes and a server killed again and again: one such test at a time
# (CONTRIBUTING.md: the "processes" group).
# nats-py, reconnecting from a server killed under it, can leave the dead connection's socket
# for the garbage collector (a ResourceWarning raised later, in whatever test runs then):
# the client's, not aqw's; every other test keeps warnings as errors.
RECONNECT_LEAK = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.xdist_group("processes"),
    RECONNECT_LEAK,
]

HERE = Path(__file__).parent
JOBS = int(os.environ.get("AQW_CHAOS_JOBS", "2000"))
KILLS = int(os.environ.get("AQW_CHAOS_KILLS", "20"))
WORKERS = 4


async def test_kills_of_workers_and_of_the_server_lose_nothing_and_apply_nothing_twice(
    private_server: Server, tmp_path: Path
) -> None:
    queue = f"chaos-{uuid.uuid4().hex[:8]}"
    table = f"nats_chaos_{uuid.uuid4().hex[:8]}"
    db = await asyncpg.connect(DSN)
    await SqlCompletionStore().ensure_schema(db)
    await db.execute(f"CREATE TABLE {table} (job_id text, n int, fence bigint)")
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[2])}
    url = private_server.url
    procs: list[Forked] = []

    logs = tmp_path / "workers.log"

    async def spawn() -> Forked:
        with logs.open("ab") as log:
            return await spawn_script(HERE / "chaos_worker.py", url, queue, table, log=log, env=env)

    producer = aqw.App(f"{url}?queue={queue}&ack_wait=3")
    jobs = [Job(task="apply", payload=n) for n in range(JOBS)]
    try:
        for start in range(0, JOBS, 100):  # 100 records' creates at a time: within the
            await producer.broker.publish(jobs[start : start + 100])  # timeout, however loaded
        await producer.broker.close()
        started = time.monotonic()
        timeline: list[str] = []  # applied count every 0.5 s, with the faults marked

        watch = await asyncpg.connect(DSN)

        async def sample() -> None:
            while True:
                n = await watch.fetchval(f"SELECT count(*) FROM {table}")
                timeline.append(f"{time.monotonic() - started:.1f}s:{n}")
                await asyncio.sleep(0.5)

        sampler = asyncio.create_task(sample())
        procs = [await spawn() for _ in range(WORKERS)]
        rng = random.Random(7)
        restarts_at = {KILLS // 3, 2 * KILLS // 3}
        for kill in range(KILLS):
            await asyncio.sleep(0.2 + rng.random() * 0.3)
            victim = rng.randrange(WORKERS)
            procs[victim].kill()
            await procs[victim].wait()
            procs[victim] = await spawn()
            timeline.append(f"kill{kill}")
            if kill in restarts_at:
                private_server.kill()  # SIGKILL: no clean shutdown of the file store
                await asyncio.sleep(0.5)
                private_server.start()
                timeline.append("server-restart")
        last_fault = time.monotonic()

        seen: list[int] = []

        async def all_applied() -> bool:
            seen.append(await db.fetchval(f"SELECT count(DISTINCT job_id) FROM {table}"))
            return seen[-1] >= JOBS

        try:
            await eventually(all_applied, 120, f"all {JOBS} jobs applied", interval=0.2)
        except AssertionError:
            check = aqw.App(f"{url}?queue={queue}&ack_wait=3").broker
            depth = await check.depth()
            await check.close()
            raise AssertionError(f"{seen[-1]} of {JOBS} applied; {depth}") from None
        drained_in = time.monotonic() - last_fault
        at_fault = seen[0] if seen else 0
        print(f"drained {drained_in:.1f}s after the last fault ({at_fault} of {JOBS} applied then)")
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        await watch.close()
        print("applied, every 0.5 s from the first worker's start:", " ".join(timeline))
        twice = await db.fetch(
            f"SELECT job_id, count(*) FROM {table} GROUP BY job_id HAVING count(*) > 1"
        )
        assert twice == []  # 0 effects applied twice
        rows = await db.fetchval(f"SELECT count(*) FROM {table}")
        assert rows == JOBS  # 0 lost
        ids = {r["job_id"] for r in await db.fetch(f"SELECT job_id FROM {table}")}
        assert ids == {j.id for j in jobs}
        check = aqw.App(f"{url}?queue={queue}&ack_wait=3").broker

        async def empty() -> bool:
            d = await check.depth()
            return (d.waiting, d.in_flight, d.delayed, d.dead) == (0, 0, 0, 0)

        try:
            await eventually(empty, 30, "the queue drained, nothing dead", interval=0.2)
        except AssertionError:
            import nats

            nc = await nats.connect(url)
            js = nc.jetstream()
            streams = [(i.config.name, i.state.messages) for i in await js.streams_info()]
            consumers = [
                (c.name, c.num_pending, c.num_ack_pending, c.num_redelivered)
                for name, _ in streams
                for c in await js.consumers_info(name)
            ]
            left = await _what_is_left(nc, check)
            await nc.close()
            depth = await check.depth()
            await check.close()
            raise AssertionError(
                f"not empty: {depth}; streams {streams}; consumers {consumers}; {left}"
            ) from None
        await check.close()
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
        await db.execute(f"DROP TABLE {table}")
        await db.execute("DELETE FROM aqw_completions WHERE queue = $1", queue)
        await db.execute("DELETE FROM aqw_fences WHERE queue = $1", queue)
        await db.close()


async def _what_is_left(nc: Any, check: Any) -> str:
    """The queue's consumer (ack floor, last delivered), the messages left in its stream
    above and below the floor with their jobs' record states, and what a repair run that
    walks every pending range then does."""
    js = nc.jetstream()
    names = check.names
    info = await js.consumer_info(names.stream, names.consumer)
    floor, last = info.ack_floor.stream_seq, info.delivered.stream_seq
    left: list[str] = []
    seq = 1
    while len(left) < 60:
        try:
            msg = await js.get_msg(names.stream, seq, subject=names.subject, next=True)
        except Exception:
            break
        seq = int(msg.seq or 0) + 1
        record = await check.records.record(Job.decode(msg.data or b"").id)
        side = "below" if msg.seq is not None and msg.seq <= floor else "above"
        left.append(f"{msg.seq}:{side}:{record.state if record else None}")
    repairer = Repairer(nc, js)
    repairer.after_outage()
    done = await repairer.run(check._repair_parts())
    after = await js.consumer_info(names.stream, names.consumer)
    return (
        f"floor {floor}, last {last}; left {left}; a walking repair: {done}, then "
        f"{after.num_pending} waiting and {after.num_ack_pending} in flight"
    )
