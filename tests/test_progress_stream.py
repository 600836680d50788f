"""Progress you can stream (issue 28): ``async for p in app.progress(job_id)`` yields each
``ctx.progress`` update in order and ends with the job's final state; the stream is bounded
per job; a reader of a finished job gets its end at once. On memory, fakeredis and Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from conftest import Backend

import aqw
from aqw.brokers.local.progress import PROGRESS_KEEP
from aqw.brokers.redis import PartitionedBroker
from tests._helpers import REDIS_URL, require_real_redis, run_burst, running

pytestmark = pytest.mark.timeout(90)


async def collect(app: aqw.App, job_id: str) -> list[Any]:
    return [p async for p in app.progress(job_id)]


async def test_a_thousand_updates_reach_two_readers_in_order(backend: Backend) -> None:
    app = backend.app()
    go = asyncio.Event()

    @app.task(name="steps")
    async def steps(n: int, ctx: aqw.Context) -> str:
        await go.wait()
        for i in range(n):
            await ctx.progress(i / (n - 1), f"step {i}", {"i": i})
        return "done"

    job_id = await steps.enqueue(1000)
    readers = [asyncio.create_task(collect(app, job_id)) for _ in range(2)]
    async with running(app.worker(concurrency=1)):
        await asyncio.sleep(0.2)  # the readers are waiting (what they read is counted)
        go.set()
        got = await asyncio.wait_for(asyncio.gather(*readers), 60)
    for seen in got:
        updates, end = seen[:-1], seen[-1]
        assert [u.detail["i"] for u in updates] == list(range(1000))
        assert updates[0].message == "step 0" and updates[-1].fraction == 1.0
        assert not any(u.final for u in updates)
        assert end.final and end.state == "succeeded" and end.info is not None


async def test_the_stream_is_bounded_and_a_finished_jobs_reader_ends_at_once(
    backend: Backend,
) -> None:
    app = backend.app()
    n = PROGRESS_KEEP + 500

    @app.task(name="steps")
    async def steps(ctx: aqw.Context) -> None:
        for i in range(n):
            await ctx.progress(i / n, "", i)

    job_id = await steps.enqueue()
    await run_burst(app)
    got = await asyncio.wait_for(collect(app, job_id), 10)  # no wait: the job has ended
    assert [u.detail for u in got[:-1]] == list(range(500, n))  # the last PROGRESS_KEEP
    assert got[-1].state == "succeeded"
    if backend.raw is not None:
        key = f"aqw:{{{app.queue}}}:progress:{job_id}"
        assert await backend.raw.xlen(key) == PROGRESS_KEEP
        assert 0 < await backend.raw.ttl(key) <= 3600


async def test_a_job_without_updates_and_an_unknown_job(backend: Backend) -> None:
    app = backend.app()

    @app.task(name="quiet")
    async def quiet() -> None:
        raise aqw.Reject("no")

    job_id = await quiet.enqueue()
    reader = asyncio.create_task(collect(app, job_id))
    await run_burst(app)
    got = await asyncio.wait_for(reader, 10)
    assert len(got) == 1 and got[0].state == "dead"
    with pytest.raises(aqw.UnknownJob):
        await collect(app, "no-such-job")


async def test_a_bad_detail_is_refused_in_one_line(backend: Backend) -> None:
    app = backend.app()
    errors: list[str] = []

    @app.task(name="bad")
    async def bad(ctx: aqw.Context) -> None:
        for detail in ({"x": object()}, "x" * 5000, float("nan")):
            try:
                await ctx.progress(0.5, "", detail)
            except aqw.ConfigError as exc:
                errors.append(str(exc))

    await bad.enqueue()
    await run_burst(app)
    assert len(errors) == 3 and all(e.startswith("ctx.progress(detail): ") for e in errors)
    assert "at most 4096 bytes" in errors[1]


async def test_a_partitioned_queue_refuses_in_one_line(queue_name: str) -> None:
    require_real_redis()
    app = aqw.App(PartitionedBroker(REDIS_URL, queue_name, 2))

    @app.task(name="t")
    async def t() -> None: ...

    try:
        job_id = await t.enqueue()
        with pytest.raises(aqw.ConfigError, match="does not stream progress"):
            await collect(app, job_id)
    finally:
        await app.close()
