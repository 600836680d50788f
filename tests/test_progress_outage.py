"""``ctx.progress()`` is best effort: through a Redis restart (a private redis-server, stopped
while a job reports progress and started again a few seconds later) the report is retried
briefly, then dropped with ONE warning, and the job goes on and succeeds."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest
from conftest import PrivateRedis
from redis.asyncio import Redis

import aqw
from tests._helpers import eventually, running

pytestmark = [pytest.mark.timeout(90)]

STEPS = 60


async def test_progress_during_a_redis_restart_never_fails_the_job(
    private_redis: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="aqw.worker")
    app = aqw.App(private_redis.url, queue="progress-outage", lease_ttl=30.0)
    steps: list[int] = []

    @app.task(name="report", max_retries=0)
    async def report(ctx: aqw.Context) -> None:
        for i in range(STEPS):
            await ctx.progress(i / STEPS, f"step {i}")
            steps.append(i)
            await asyncio.sleep(0.05)

    admin = Redis.from_url(private_redis.url)
    try:
        async with running(app.worker(concurrency=2, heartbeat=0.5)):
            job_id = await report.enqueue()
            await eventually(lambda: len(steps) >= 5, 10, "the first progress reports")
            with contextlib.suppress(Exception):  # the server may hang up before it answers
                await admin.shutdown(save=True)  # its data comes back with it
            assert private_redis.proc is not None
            private_redis.proc.wait(timeout=10)
            private_redis.proc = None
            port = private_redis.port
            await asyncio.sleep(5.0)  # longer than a report is retried: one is dropped
            private_redis.start()
            assert private_redis.port == port, "the server came back on another port"
            await eventually(lambda: len(steps) == STEPS, 30, "the handler's last step")
            info = await eventually_ended(app, job_id)
    finally:
        await admin.aclose()
        await app.close()
    assert steps == list(range(STEPS)), "the handler ran each step once, to its end"
    assert info.state == "succeeded", info
    about_progress = [
        r for r in caplog.records if r.name == "aqw.worker" and "its progress" in r.getMessage()
    ]
    warned = [r for r in about_progress if r.levelno == logging.WARNING]
    assert len(warned) == 1, [r.getMessage() for r in about_progress]
    assert f"job {job_id} (report)" in warned[0].getMessage()
    assert "dropped, the job goes on" in warned[0].getMessage()
    failed = [
        r.getMessage()
        for r in caplog.records
        if r.name == "aqw.worker" and job_id in r.getMessage() and "failed" in r.getMessage()
    ]
    assert not failed, failed


async def eventually_ended(app: aqw.App, job_id: str) -> aqw.JobInfo:
    """The job's record once it ended (the worker's ack may wait for the server)."""

    async def ended() -> aqw.JobInfo | None:
        info = await app.job(job_id)
        return info if info is not None and info.state not in ("queued", "running") else None

    info: aqw.JobInfo = await eventually(ended, 20, f"job {job_id} to end")
    return info
