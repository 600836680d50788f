"""Chaos on the PostgreSQL broker: the server restarts (an immediate-mode stop, i.e. a
crash, then a start) while two worker processes drain 500 jobs whose effect is guarded
by ``ctx.effect``. Nothing is lost, no effect is applied twice, and the workers recover
by themselves (nobody restarts them). The server is a throwaway cluster of the test's own
(``throwaway.py``), never the shared one."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import asyncpg
import pytest

import aqw
from aqw.idempotency import SqlCompletionStore
from tests._helpers import eventually
from tests.pg_broker.throwaway import ThrowawayPostgres, count_on

pytestmark = [pytest.mark.timeout(120), pytest.mark.xdist_group("processes")]
HERE = Path(__file__).resolve().parent
JOBS = 500


async def test_a_server_restart_mid_drain_loses_nothing_and_doubles_nothing(
    server: ThrowawayPostgres,
) -> None:
    url = f"{server.dsn}?schema=aqw&queue=q"
    app = aqw.App(url)

    @app.task(name="effect")
    async def effect(n: int) -> None: ...

    await app.broker.connect()  # creates the tables
    conn = await asyncpg.connect(server.dsn)
    await conn.execute("CREATE TABLE effects (n int NOT NULL)")  # no unique: doubles show
    await SqlCompletionStore("effects_completions").ensure_schema(conn)
    await conn.close()
    await effect.enqueue_many(list(range(JOBS)))
    await app.close()

    script = str(HERE / "pg_restart_proc.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    workers = [
        await asyncio.create_subprocess_exec(
            sys.executable, script, url, "effects", "0.05", env=env
        )
        for _ in range(2)
    ]
    effects = "SELECT count(*) FROM effects"
    try:

        async def some_done() -> bool:
            return (await count_on(server.dsn, effects) or 0) >= 100

        await eventually(
            some_done, 60, "100 effects before the restart", interval=0.05, procs=workers
        )
        before = await count_on(server.dsn, effects)
        await asyncio.to_thread(server.restart)
        assert before is not None and before < JOBS  # the restart came mid-drain

        async def drained() -> bool:
            left = await count_on(server.dsn, "SELECT count(*) FROM aqw.aqw_jobs")
            return left == 0 and await count_on(server.dsn, effects) == JOBS

        await eventually(drained, 60, "the workers drained the queue", interval=0.2, procs=workers)
        assert all(w.returncode is None for w in workers)  # they recovered, nobody restarted them
    finally:
        for w in workers:
            if w.returncode is None:
                w.kill()
            await w.wait()
    conn = await asyncpg.connect(server.dsn)
    try:
        rows = await conn.fetch("SELECT n, count(*) AS c FROM effects GROUP BY n")
        dead = await conn.fetchval("SELECT count(*) FROM aqw.aqw_dead")
    finally:
        await conn.close()
    assert sorted(r["n"] for r in rows) == list(range(JOBS))  # nothing lost
    assert {r["c"] for r in rows} == {1}  # nothing applied twice
    assert dead == 0
