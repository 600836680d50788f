"""Workers on the PostgreSQL broker, against the real PostgreSQL: jobs run once each, a
failing job retries then dead-letters, the outbox relays onto it, and a worker SIGKILLed
mid-job leaves its jobs to be reclaimed by another (none lost, none acked unfinished)."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

import aqw
from aqw.outbox import Outbox
from tests._helpers import PG_DSNS, eventually

pytestmark = pytest.mark.timeout(90)
HERE = Path(__file__).resolve().parent


@pytest.fixture
async def where() -> AsyncIterator[tuple[str, str, str]]:
    """(dsn, schema, queue) of a fresh schema, dropped at the end."""
    dsn, schema, queue = PG_DSNS[0], f"aqw_pgw_{uuid.uuid4().hex[:10]}", "q"
    yield dsn, schema, queue
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


def url(where: tuple[str, str, str]) -> str:
    dsn, schema, queue = where
    return f"{dsn}?schema={schema}&queue={queue}"


async def test_jobs_run_once_and_a_failing_one_is_dead_lettered(
    where: tuple[str, str, str],
) -> None:
    app = aqw.App(url(where), retry=aqw.RetryPolicy(max_retries=2, base=0.01, cap=0.02))
    assert type(app.broker).__name__ == "PostgresBroker" and app.queue == "q"
    seen: list[int] = []
    tries: list[int] = []

    @app.task
    async def add(n: int) -> None:
        seen.append(n)

    @app.task(name="broken")
    async def broken(n: int) -> None:
        tries.append(n)
        raise ValueError(f"bad {n}")

    await add.enqueue_many(list(range(200)))
    await broken.enqueue(7)
    await add.enqueue(1000, priority=9, delay=0.2)
    async with app.worker(concurrency=20) as worker:
        await eventually(lambda: len(seen) == 201 and len(tries) == 3, 30, "all ran")
        await eventually(lambda: worker.in_flight == 0, 10, "settled")
        dead = await app.dlq.list()
    assert sorted(seen) == [*range(200), 1000]
    assert tries == [7, 7, 7]
    assert [(d.task, d.error_type, d.attempts) for d in dead] == [("broken", "ValueError", 3)]
    depth = await app.broker.depth()
    assert (depth.waiting, depth.in_flight, depth.delayed, depth.dead) == (0, 0, 0, 1)
    await app.close()


async def test_outbox_relays_onto_the_postgresql_broker(where: tuple[str, str, str]) -> None:
    dsn, schema, _ = where
    app = aqw.App(url(where), outbox=Outbox(dsn, schema=schema, poll=0.2))
    seen: list[int] = []

    @app.task
    async def receipt(n: int) -> None:
        seen.append(n)

    await app.outbox.migrate()  # type: ignore[union-attr]
    conn = await asyncpg.connect(dsn)
    try:
        async with app.worker(concurrency=5):
            for n in range(10):
                try:
                    async with conn.transaction():
                        await receipt.enqueue(n, conn=conn)
                        if n % 2:
                            raise RuntimeError("rolled back")
                except RuntimeError:
                    pass
            await eventually(lambda: sorted(seen) == [0, 2, 4, 6, 8], 30, "committed ran")
    finally:
        await conn.close()
    assert sorted(seen) == [0, 2, 4, 6, 8]
    await app.close()


async def test_a_sigkilled_worker_loses_nothing(where: tuple[str, str, str]) -> None:
    """A worker process is SIGKILLed while its jobs run (their lease 1 s); a second worker
    reclaims them once their leases lapse: every job ends acked exactly once in the
    ledger (a unique row per job, written in the handler before it returns)."""
    dsn, schema, _ = where
    app = aqw.App(url(where), lease_ttl=1.0)

    @app.task(name="slow")
    async def slow(n: int) -> None: ...

    await app.broker.connect()
    ledger = f'"{schema}".ledger'
    conn = await asyncpg.connect(dsn)
    await conn.execute(f"CREATE TABLE {ledger} (n int, attempt int)")
    await slow.enqueue_many(list(range(40)))
    script = str(HERE / "pg_worker_proc.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    victim = await asyncio.create_subprocess_exec(
        sys.executable, script, url(where), ledger, "3600", env=env
    )
    try:
        await eventually(
            lambda: conn.fetchval(f"SELECT count(*) FROM {ledger}"), 30, "the victim started"
        )
    finally:
        victim.kill()
        await victim.wait()
    rescuer = await asyncio.create_subprocess_exec(
        sys.executable, script, url(where), ledger, "0", env=env
    )
    try:

        async def drained() -> bool:
            depth = await app.broker.depth()
            return depth.waiting + depth.in_flight + depth.delayed == 0

        await eventually(drained, 60, "the rescuer drained the queue", procs=[rescuer])
    finally:
        rescuer.kill()
        await rescuer.wait()
    rows = await conn.fetch(f"SELECT n, attempt FROM {ledger} WHERE attempt >= 0")
    finished = sorted(r["n"] for r in rows if r["attempt"] > 0)
    assert finished == list(range(40))  # each job finished exactly once
    await conn.close()
    await app.close()


async def test_connections_terminated_mid_run_lose_no_job(where: tuple[str, str, str]) -> None:
    """``pg_terminate_backend`` of every connection of the worker (pool and listener) while
    jobs run: the worker reconnects and the queue drains; every job ran (at least once: an
    ack cut with its connection is redelivered, as after a crash)."""
    dsn, schema, queue = where
    app = aqw.App(f"{dsn}?schema={schema}&queue={queue}&application_name={schema}", lease_ttl=2)
    seen: list[int] = []

    @app.task(name="step")
    async def step(n: int) -> None:
        await asyncio.sleep(0.005)
        seen.append(n)

    await step.enqueue_many(list(range(300)))
    admin = await asyncpg.connect(dsn)
    try:
        async with app.worker(concurrency=20):
            await eventually(lambda: len(seen) >= 50, 30, "50 jobs ran")
            killed = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = $1",
                schema,
            )

            async def drained() -> bool:
                try:
                    depth = await app.broker.depth()
                except Exception:  # the pool finding its connections gone
                    return False
                return depth.waiting + depth.in_flight + depth.delayed == 0

            await eventually(drained, 60, "the queue drained after the terminations")
    finally:
        await admin.close()
    assert killed >= 2  # the pool's connections and the listener
    assert set(seen) == set(range(300))
    # The listener is open again: the next fetch that waits reopened it.
    await app.broker.fetch(1, 1.5)
    assert await app.broker.fetch(1, 1.5) == []
    listener = app.broker._conn._listener  # type: ignore[attr-defined]
    assert listener is not None and not listener.is_closed()
    await app.close()


async def test_periodic_tasks_tick_once_across_two_workers(where: tuple[str, str, str]) -> None:
    """Two workers (two brokers, as two processes would have) share the schedule marks and
    the leader lease in PostgreSQL: each tick is enqueued once (its idempotency key)."""
    ticks: list[str] = []
    apps = []
    for _ in range(2):
        app = aqw.App(url(where))

        @app.task(name="tick", schedule=aqw.Every(1))
        async def tick(ctx: aqw.Context) -> None:
            ticks.append(ctx.job.key or "")

        apps.append(app)
    async with apps[0].worker(concurrency=2), apps[1].worker(concurrency=2):
        await eventually(lambda: len(ticks) >= 2, 30, "two ticks ran")
    assert len(ticks) == len(set(ticks))  # no tick twice
    assert all(k.startswith("cron:tick:") for k in ticks)
    marks = await apps[0].broker.marks.read()
    assert "tick" in marks
    for app in apps:
        await app.close()


async def test_a_stopped_consumers_jobs_are_reclaimed_while_a_backlog_still_waits(
    where: tuple[str, str, str],
) -> None:
    """Found by the chaos run (``test_chaos.py``): with a backlog the fetch refilled every
    slot first, and the reclaim, which took only into free slots, left a stopped
    consumer's jobs until the whole backlog had drained. Now they run while it waits."""
    app = aqw.App(url(where), lease_ttl=1.0)
    ran: list[int] = []

    @app.task(name="step")
    async def step(n: int) -> None:
        ran.append(n)
        await asyncio.sleep(0.02)

    await step.enqueue_many([-1, -2, -3])  # taken by a consumer that stops at once
    gone = aqw.App(url(where)).broker
    await gone.connect()
    await gone.start_consuming("gone")
    assert len(await gone.fetch(3, 1.0)) == 3
    await gone.close()
    await step.enqueue_many(list(range(2000)))  # 2,000 x 20 ms at concurrency 10: >= 4 s
    async with app.worker(concurrency=10):
        await eventually(lambda: {-1, -2, -3} <= set(ran), 60, "the abandoned jobs reclaimed")
        backlog = (await app.broker.depth()).waiting
        await eventually(lambda: len(ran) == 2003, 60, "the backlog drained")
    assert backlog > 0, "the abandoned jobs ran only once the backlog was gone"
    assert sorted(ran) == [-3, -2, -1, *range(2000)]  # each once
    await app.close()
