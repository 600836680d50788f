"""Batches and flows through every fault at once (issue 24's chaos run): four worker
processes on a redis-server of the test's own (AOF, fsync always), one SIGKILLed while it
holds children and then one every ~2 s (each replaced), one SIGSTOPped past its lease and
then resumed, and the Redis server SIGKILLed and started again, all in the same run.

Every batch completes with every child counted once (a child a killed worker was running
runs again and still counts once; the paused worker's late acks count nothing), each
batch's callback job exists once (one id per batch in the callbacks' runs, the one its
``batch:<id>:complete`` key names) and its effect, written under ``ctx.effect`` in
PostgreSQL, is one row. Every flow ends with every step succeeded and its result right,
a batch step's dependant among them (enqueued once, after the batch step's last child).

At the issue's scale: 50 batches of 100 children and 20 flows of 10 steps (about 12 s on a
loaded 2-core VM: docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import IO, Any

import asyncpg
import pytest
from batch_worker import LEASE_TTL, ledger_keys, make_app
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError

import aqw
from aqw.brokers.batching import callback_key
from aqw.brokers.redis import RedisBroker
from aqw.idempotency import SqlCompletionStore
from tests._helpers import PG_DSNS, eventually
from tests._spawn import Forked, spawn_script
from tests.test_batch_restart import AofRedis

BATCHES, CHILDREN, FLOWS = 50, 100, 20
WORKERS = 4
#: SIGKILLs after the first, one every ~2 s while the run lasts (each worker replaced).
MORE_KILLS = 5
KILLED = (-signal.SIGKILL,)

pytestmark = [
    pytest.mark.redis,
    pytest.mark.timeout(180),
    pytest.mark.xdist_group("processes"),
]


#: The jobs of one flow: its 11 steps, the batch step's 5 children in place of one.
FLOW_JOBS = 10 + 5 + 1


def _flow(step: aqw.Task[Any]) -> aqw.Flow:
    """s0 -> s1 .. s4; s0 -> s5 .. s7; [s4, s7] -> s8 -> s9 (11); and a batch step after s0,
    fan (5 children of step, on 1 .. 5), -> s10 (the children's results summed, plus 1: 21)."""
    flow = aqw.Flow()
    s0 = flow.add(step, 0, name="s0")
    left = right = s0
    for i in range(1, 5):
        left = flow.add(step, after=left, name=f"s{i}")
    for i in range(5, 8):
        right = flow.add(step, after=right, name=f"s{i}")
    flow.add(step, after=flow.add(step, after=[left, right], name="s8"), name="s9")
    fan = flow.batch(step, [1, 2, 3, 4, 5], after=s0, name="fan")
    flow.add(step, after=fan, name="s10")
    return flow


async def test_batches_and_flows_survive_kills_a_pause_and_a_redis_restart_at_once(
    queue_name: str,
    repo_root: Path,
    subprocess_env: dict[str, str],
    tmp_path: Path,
) -> None:
    server = AofRedis(tmp_path)
    server.start()
    url = f"redis://127.0.0.1:{server.port}/0"
    env = {**subprocess_env, "AQW_TEST_REDIS_URL": url}
    # the test's own reads: a connection the restart closed is opened again
    client = Redis.from_url(
        url, retry=Retry(ExponentialBackoff(cap=1.0), 10), retry_on_error=[ConnectionError]
    )
    dsn = PG_DSNS[0]
    pg = await asyncpg.connect(dsn)
    table = f"aqw_t_{queue_name.replace('-', '_')}"
    store = SqlCompletionStore(f"{table}_completions")
    await store.ensure_schema(pg)
    await pg.execute(f"CREATE TABLE {table}_effects (batch_id text NOT NULL, job_id text NOT NULL)")
    producer = make_app(queue_name, url=url)
    child, done, step = (producer.tasks[n] for n in ("child", "done", "step"))
    children_runs, callback_runs = ledger_keys(queue_name)
    procs: list[Forked] = []
    logs: list[IO[bytes]] = []
    events: list[str] = []

    async def spawn() -> Forked:
        log = (tmp_path / f"worker-{len(procs)}.log").open("wb")
        logs.append(log)
        proc = await spawn_script(
            repo_root / "tests" / "batch_worker.py",
            *(queue_name, dsn, store.table, f"{table}_effects"),
            cwd=repo_root,
            env=env,
            log=log,
        )
        procs.append(proc)
        return proc

    try:
        started = time.monotonic()
        batch_ids = []
        for _ in range(BATCHES):
            async with producer.batch(on_complete=done) as batch:
                await batch.enqueue_many(child, list(range(CHILDREN)))
            batch_ids.append(batch.id)
        handles = [await producer.start(_flow(step)) for _ in range(FLOWS)]
        broker = producer.broker
        assert isinstance(broker, RedisBroker)
        for _ in range(WORKERS):
            await spawn()

        async def ran_at_least(share: float) -> bool:
            return int(await client.llen(children_runs)) >= BATCHES * CHILDREN * share

        await eventually(
            lambda: ran_at_least(0.2), 60, "a fifth of the children", procs=procs, interval=0.01
        )

        async def held(proc: Forked) -> int:
            summary = await client.xpending(broker.keys.stream, "aqw")
            return sum(
                int(c["pending"])
                for c in summary["consumers"]
                if f"-{proc.pid}-" in c["name"].decode()
            )

        async def frozen_holding(proc: Forked) -> int:
            """SIGSTOP ``proc`` at a moment it holds children (tried again until it does)."""
            for _ in range(300):
                proc.send_signal(signal.SIGSTOP)
                if await held(proc):
                    return 1
                proc.send_signal(signal.SIGCONT)
                await asyncio.sleep(0.01)
            raise AssertionError(f"worker {proc.pid} never held a child: nothing tested")

        async def kill_holding(proc: Forked) -> None:
            await frozen_holding(proc)
            proc.send_signal(signal.SIGKILL)
            await asyncio.wait_for(proc.wait(), 10)
            events.append(f"SIGKILL {proc.pid}")

        paused, victim = procs[0], procs[1]
        await frozen_holding(paused)  # frozen past its lease: its children taken over
        frozen_at = time.monotonic()
        events.append(f"SIGSTOP {paused.pid}")
        await kill_holding(victim)
        await spawn()
        before = int(await client.llen(children_runs))
        assert before < BATCHES * CHILDREN, "the drain ended before the faults: nothing tested"
        server.kill()  # mid-drain: children running, settles on their way, one worker frozen
        events.append("redis SIGKILL")
        await asyncio.sleep(0.5)
        server.start()
        events.append("redis started again")
        await asyncio.sleep(max(0.0, frozen_at + LEASE_TTL * 2.5 - time.monotonic()))
        paused.send_signal(signal.SIGCONT)
        events.append(f"SIGCONT {paused.pid}")

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

        for _ in range(MORE_KILLS):  # one more every ~2 s, while there is work left
            await asyncio.sleep(2.0)
            if await all_complete():
                break
            alive = [p for p in procs if p.returncode is None and p is not paused]
            try:
                await kill_holding(random.choice(alive))
            except AssertionError:  # nothing left to hold: the drain is at its end
                break
            await spawn()

        await eventually(
            all_complete, 90, "every batch and flow complete", procs=procs, allowed_exits=KILLED
        )
        drained = time.monotonic() - started
        live = [p for p in procs if p.returncode is None]

        def all_ready() -> bool:  # each survivor serves (its signal handlers are set)
            return all(
                b"ready" in (tmp_path / f"worker-{procs.index(p)}.log").read_bytes() for p in live
            )

        await eventually(all_ready, 30, "the workers ready", procs=procs, allowed_exits=KILLED)
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        for proc in live:
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        kills = sum(e.startswith("SIGKILL") for e in events)
        assert kills >= 2, events  # the first kill and at least one more happened
        print(f"drained {BATCHES}x{CHILDREN} + {FLOWS} flows in {drained:.1f} s: {events}")

        for batch_id in batch_ids:
            info = await producer.batch_info(batch_id)
            assert info is not None
            assert (info.total, info.succeeded, info.pending, info.failed, info.cancelled) == (
                CHILDREN,
                CHILDREN,
                0,
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
        for batch_id, job_ids in runs.items():  # one callback job per batch, however often run
            info = await producer.batch_info(batch_id)
            assert info is not None and job_ids == {info.callbacks["complete"]}, job_ids
            key = broker.keys.idempotency(callback_key(batch_id, "complete"))
            assert (await client.get(key)).decode() == info.callbacks["complete"]
        ran = [raw.decode() for raw in await client.lrange(children_runs, 0, -1)]
        assert len(set(ran)) == BATCHES * CHILDREN  # every child ran; a few twice, counted once
        for handle in handles:  # s10: (2 + 3 + 4 + 5 + 6) + 1, after every child of fan
            assert await handle.result(timeout=10) == {"s9": 11, "s10": 21}
            flow_info = await handle.info()
            assert flow_info is not None
            assert {s.state for s in flow_info.steps.values()} == {"succeeded"}
            assert (flow_info.batch.succeeded, flow_info.batch.total) == (FLOW_JOBS, FLOW_JOBS)
            fan = flow_info.steps["fan"].batch
            assert fan is not None and (fan.succeeded, fan.total, fan.pending) == (5, 5, 0)
        stepped = {raw.decode() for raw in await client.lrange(children_runs + ":steps", 0, -1)}
        assert len(stepped) == FLOWS * FLOW_JOBS  # each step's job exists once
        rows = await pg.fetch(f"SELECT batch_id, job_id FROM {table}_effects")
        assert sorted(r["batch_id"] for r in rows) == sorted(batch_ids)  # one row per batch
        fired = {b: (await producer.batch_info(b)) for b in batch_ids}
        assert {r["batch_id"]: r["job_id"] for r in rows} == {
            b: i.callbacks["complete"] for b, i in fired.items() if i is not None
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
        server.kill()
