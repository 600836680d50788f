"""A late ack on JetStream: a holder SIGSTOPped past its ack window while the job is
redelivered to another worker and finished there, then resumed (SIGCONT). The server would
take its ack (nats-server accepts an ack after the window, the message redelivered); aqw
never sends it: the confirmed end of the window has passed. Its fenced write is refused
too (the new holder's KV revision is greater), and the job's effect happens once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest

import aqw
from tests._helpers import eventually

from .conftest import URL
from .pause_worker import DSN, register

pytestmark = pytest.mark.timeout(90)

HERE = Path(__file__).parent


async def test_a_paused_holders_late_ack_and_fenced_write_are_refused(
    nats_queue: str, tmp_path: Path
) -> None:
    table = f"nats_ledger_{uuid.uuid4().hex[:8]}"
    db = await asyncpg.connect(DSN)
    await db.execute(f"CREATE TABLE {table} (job_id text PRIMARY KEY, fence bigint, worker text)")
    await db.execute(f"CREATE TABLE {table}_applied (job_id text, worker text)")
    steps = tmp_path / "steps"
    steps.touch()
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[2])}
    a = await asyncio.create_subprocess_exec(
        sys.executable,
        str(HERE / "pause_worker.py"),
        URL,
        nats_queue,
        "a",
        str(steps),
        table,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
    )
    b_app = aqw.App(f"{URL}?queue={nats_queue}&ack_wait=2", lease_ttl=2.0)
    register(b_app, "b", steps, table)
    b = b_app.worker(concurrency=1, grace=0.5)
    b_run: asyncio.Task[None] | None = None
    try:
        [job_id] = await b_app.enqueue("pay", [1])

        async def lines() -> list[list[str]]:
            return [line.split() for line in steps.read_text().splitlines()]

        [[_, _, a_fence]] = await eventually(lines, 20, "worker a starts the job")
        os.kill(a.pid, signal.SIGSTOP)  # frozen 0-1.5 s into its handler, before its write
        b_run = asyncio.create_task(b.run())

        async def b_wrote() -> bool:
            return ["write", "b", "True"] in await lines()

        await eventually(b_wrote, 30, "worker b runs the redelivered job and writes")

        async def settled() -> bool:
            d = await b_app.broker.depth()
            return (d.waiting, d.in_flight) == (0, 0)

        await eventually(settled, 10, "worker b acks the job")
        os.kill(a.pid, signal.SIGCONT)
        await asyncio.sleep(3.0)  # a resumes: past its window, its lease's end fires
        a.send_signal(signal.SIGUSR1)
        assert a.stdout is not None
        a_stats = json.loads(await asyncio.wait_for(a.stdout.readline(), 20))
    finally:
        if a.returncode is None:
            os.kill(a.pid, signal.SIGCONT)
            a.kill()
            await a.wait()
        if b_run is not None:
            await b.stop()
            await b_run
        await b_app.broker.close()
    try:
        steps_seen = await lines()
        b_fence = next(int(s[2]) for s in steps_seen if s[:2] == ["start", "b"])
        assert b_fence > int(a_fence)  # the new holder's fencing token is greater
        assert ["write", "a", "True"] not in steps_seen  # a's write never went through
        assert a_stats.get("processed", 0) == 0  # a's late ack was never sent
        assert (await b_app.broker.stats()).get("processed") == 1
        applied = await db.fetch(f"SELECT job_id, worker FROM {table}_applied")
        assert [tuple(r) for r in applied] == [(job_id, "b")]  # the effect, once
        assert (await db.fetchval(f"SELECT fence FROM {table}")) == b_fence
    finally:
        await db.execute(f"DROP TABLE {table}, {table}_applied")
        await db.close()
