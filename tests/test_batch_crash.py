"""Batches through a crash on the real Redis: 20 batches of 50 children, three worker
processes (and 10 flows of 10 steps beside them), one SIGKILLed while it holds children (a
fourth started in its place), another
SIGSTOPped past its lease and then resumed. Every batch completes, every child counted once
(a child the victim was running runs again and still counts once; the paused worker's late
acks count nothing), each batch's callback job exists once (one id per batch in the
callbacks' runs, the one its ``batch:<id>:complete`` key names), and its effect, written
under ``ctx.effect`` in PostgreSQL, is one row. Every flow ends with every step succeeded and
the result its chain and fan-in make."""

from __future__ import annotations

import asyncio
import signal
from collections import defaultdict
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from batch_worker import LEASE_TTL, ledger_keys, make_app
from redis.asyncio import Redis

import aqw
from aqw.brokers.batching import callback_key
from aqw.brokers.redis import RedisBroker
from aqw.idempotency import SqlCompletionStore
from tests._helpers import PG_DSNS, eventually
from tests._spawn import Forked, spawn_script

# Three worker processes, killed and frozen: one such test at a time (CONTRIBUTING.md).
pytestmark = [
    pytest.mark.redis,
    pytest.mark.timeout(120),
    pytest.mark.xdist_group("processes"),
]

BATCHES = 20
CHILDREN = 50
FLOWS = 10
KILLED = (-signal.SIGKILL,)


async def test_a_sigkilled_worker_mid_batch_loses_no_count_and_fires_each_callback_once(
    redis_url: str, queue_name: str, repo_root: Path, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    client = Redis.from_url(redis_url)
    dsn = PG_DSNS[0]
    pg = await asyncpg.connect(dsn)
    table = f"aqw_t_{queue_name.replace('-', '_')}"
    store = SqlCompletionStore(f"{table}_completions")
    await store.ensure_schema(pg)
    await pg.execute(f"CREATE TABLE {table}_effects (batch_id text NOT NULL, job_id text NOT NULL)")
    producer = make_app(queue_name)
    child, done = producer.tasks["child"], producer.tasks["done"]
    children_runs, callback_runs = ledger_keys(queue_name)
    procs: list[Forked] = []
    logs = []

    async def spawn(i: int) -> None:
        log = (tmp_path / f"worker-{i}.log").open("wb")
        logs.append(log)
        procs.append(
            await spawn_script(
                repo_root / "tests" / "batch_worker.py",
                *(queue_name, dsn, store.table, f"{table}_effects"),
                cwd=repo_root,
                env=subprocess_env,
                log=log,
            )
        )

    try:
        batch_ids = []
        for _ in range(BATCHES):
            async with producer.batch(on_complete=done) as batch:
                await batch.enqueue_many(child, list(range(CHILDREN)))
            batch_ids.append(batch.id)
        step = producer.tasks["step"]
        handles = []
        for _ in range(FLOWS):  # s0 -> s1 .. s4; s0 -> s5 .. s7; [s4, s7] -> s8 -> s9
            flow = aqw.Flow()
            s0 = flow.add(step, 0, name="s0")
            left = right = s0
            for i in range(1, 5):
                left = flow.add(step, after=left, name=f"s{i}")
            for i in range(5, 8):
                right = flow.add(step, after=right, name=f"s{i}")
            flow.add(step, after=flow.add(step, after=[left, right], name="s8"), name="s9")
            handles.append(await producer.start(flow))
        broker = producer.broker
        assert isinstance(broker, RedisBroker)
        for i in range(3):
            await spawn(i)

        async def a_third_run() -> bool:
            return int(await client.llen(children_runs)) >= BATCHES * CHILDREN // 3

        await eventually(a_third_run, 45, "a third of the children", procs=procs, interval=0.01)
        victim, paused = procs[0], procs[1]

        async def held(proc: Forked) -> int:
            summary = await client.xpending(broker.keys.stream, "aqw")
            return sum(
                int(c["pending"])
                for c in summary["consumers"]
                if f"-{proc.pid}-" in c["name"].decode()
            )

        async def frozen_holding(proc: Forked) -> int:
            """SIGSTOP ``proc`` at a moment it holds children (tried again until it does)."""
            for _ in range(200):
                proc.send_signal(signal.SIGSTOP)
                count = await held(proc)
                if count:
                    return count
                proc.send_signal(signal.SIGCONT)
                await asyncio.sleep(0.01)
            raise AssertionError(f"worker {proc.pid} never held a child: nothing tested")

        await frozen_holding(paused)  # frozen past its lease: its children taken over
        await frozen_holding(victim)
        victim.send_signal(signal.SIGKILL)
        await asyncio.wait_for(victim.wait(), 10)
        await spawn(3)
        await asyncio.sleep(LEASE_TTL * 2.5)
        paused.send_signal(signal.SIGCONT)

        async def all_complete() -> bool:
            for handle in handles:
                flow_info = await handle.info()
                if flow_info is None or flow_info.state != "complete":
                    return False
            infos = [await producer.batch_info(b) for b in batch_ids]
            return (
                all(i is not None and i.state == "complete" for i in infos)
                and int(await client.llen(callback_runs)) >= BATCHES
            )

        await eventually(
            all_complete, 60, "every batch complete", procs=procs, allowed_exits=KILLED
        )

        def all_ready() -> bool:  # each survivor serves (its signal handlers are set)
            return all(b"ready" in (tmp_path / f"worker-{i}.log").read_bytes() for i in range(1, 4))

        await eventually(all_ready, 30, "the workers ready", procs=procs, allowed_exits=KILLED)
        for proc in procs[1:]:
            proc.send_signal(signal.SIGTERM)
        for proc in procs[1:]:
            assert await asyncio.wait_for(proc.wait(), 20) == 0

        for batch_id in batch_ids:
            info = await producer.batch_info(batch_id)
            assert info is not None
            assert (info.total, info.succeeded, info.pending, info.failed) == (
                CHILDREN,
                CHILDREN,
                0,
                0,
            )
            assert list(info.callbacks) == ["complete"]
        runs: dict[str, set[str]] = defaultdict(set)
        entries: list[Any] = await client.lrange(callback_runs, 0, -1)
        for raw in entries:
            batch_id, job_id, succeeded = raw.decode().split()
            runs[batch_id].add(job_id)
            assert int(succeeded) == CHILDREN
        assert set(runs) == set(batch_ids)
        for batch_id, job_ids in runs.items():
            info = await producer.batch_info(batch_id)
            assert info is not None and job_ids == {info.callbacks["complete"]}, job_ids
            key = broker.keys.idempotency(callback_key(batch_id, "complete"))
            assert (await client.get(key)).decode() == info.callbacks["complete"]
        ran = [raw.decode() for raw in await client.lrange(children_runs, 0, -1)]
        assert len(set(ran)) == BATCHES * CHILDREN  # every child ran; a few twice, counted once
        for handle in handles:  # (5 + 4) + 1 at s8, + 1 at s9
            assert await handle.result(timeout=10) == 11
            flow_info = await handle.info()
            assert flow_info is not None
            assert {s.state for s in flow_info.steps.values()} == {"succeeded"}
            assert (flow_info.batch.succeeded, flow_info.batch.total) == (10, 10)
        stepped = {raw.decode() for raw in await client.lrange(children_runs + ":steps", 0, -1)}
        assert len(stepped) == FLOWS * 10
        rows = await pg.fetch(f"SELECT batch_id, job_id FROM {table}_effects")
        assert sorted(r["batch_id"] for r in rows) == sorted(batch_ids)  # one row per batch
        assert {r["batch_id"]: r["job_id"] for r in rows} == {
            b: (await producer.batch_info(b)).callbacks["complete"]  # type: ignore[union-attr]
            for b in batch_ids
        }
    finally:
        for name in (f"{table}_effects", store.table, store.fence_table):
            await pg.execute(f"DROP TABLE IF EXISTS {name}")
        await pg.close()
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        for log in logs:
            log.close()
        await producer.close()
        await client.aclose()
