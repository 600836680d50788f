"""A job's whole life through a real worker, on the memory broker, fakeredis and the real Redis:
every state read back with ``app.job()``, results with ``app.result()``, cancellation before
and while running, expiry, and records that expire."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from conftest import Backend
from pydantic import BaseModel

import aqw
from tests._helpers import eventually, run_burst, running
from tests.testkit._clocks import clock_for

pytestmark = pytest.mark.timeout(60)

FAST_RETRY = aqw.RetryPolicy(max_retries=2, base=0.01, cap=0.02)


class Sum(BaseModel):
    total: int
    note: str = ""


async def test_every_state_is_read_back(backend: Backend) -> None:
    app = backend.app(retry=FAST_RETRY)
    ran: list[str] = []

    @app.task(name="add", keep_result=True)
    async def add(a: int, b: int) -> Sum:
        ran.append("add")
        return Sum(total=a + b)

    @app.task(name="bad")
    async def bad() -> None:
        raise aqw.Reject("no good")

    @app.task(name="quiet", dead_letter=False, max_retries=0)
    async def quiet() -> None:
        raise ValueError("boom")

    @app.task(name="later")
    async def later() -> None:
        ran.append("later")

    assert await app.job("no-such-job") is None

    ok = await add.enqueue({"a": 2, "b": 3})
    info = await app.job(ok)
    assert info is not None and info.state == "queued" and info.task == "add"
    assert info.attempts == 0 and info.enqueued_at is not None and info.finished_at is None

    delayed = await later.enqueue(delay=60)
    info = await app.job(delayed)
    assert info is not None and info.state == "delayed"
    assert info.run_at is not None and info.run_at.timestamp() > time.time() + 50

    dead = await bad.enqueue()
    failed = await quiet.enqueue()
    await run_burst(app, concurrency=4)

    info = await app.job(ok)
    assert info is not None and info.state == "succeeded", info
    assert info.attempts == 1 and info.has_result and info.result == {"total": 5, "note": ""}
    assert info.started_at is not None and info.finished_at is not None
    assert info.started_at <= info.finished_at and info.worker
    assert await app.result(ok, timeout=1) == Sum(total=5)

    info = await app.job(dead)
    assert info is not None and info.state == "dead"
    entries = await app.dlq.list()
    assert [e.job_id for e in entries] == [dead]
    assert info.dlq_entry == entries[0].id
    assert info.error is not None and info.error.type == "Reject"
    assert "no good" in info.error.message
    with pytest.raises(aqw.JobFailed, match="no good"):
        await app.result(dead, timeout=1)

    info = await app.job(failed)
    assert info is not None and info.state == "failed" and info.dlq_entry is None
    assert info.error is not None and info.error.type == "ValueError"
    assert info.error.fingerprint and "boom" in info.error.traceback

    info = await app.job(delayed)
    assert info is not None and info.state == "delayed" and ran == ["add"]


async def test_a_retrying_job_records_its_last_error(backend: Backend) -> None:
    app = backend.app(retry=aqw.RetryPolicy(max_retries=3, base=30, cap=30))
    started = asyncio.Event()

    @app.task(name="flaky")
    async def flaky() -> None:
        started.set()
        raise ConnectionError("upstream down")

    job_id = await flaky.enqueue()
    async with running(app.worker()):
        await eventually(lambda: _state_is(app, job_id, "retrying"), 10, "retrying")
    info = await app.job(job_id)
    assert info is not None and info.attempts == 1
    assert info.error is not None and info.error.type == "ConnectionError"
    assert info.run_at is not None and info.run_at.timestamp() > time.time()
    with pytest.raises(TimeoutError):
        await app.result(job_id, timeout=0.2)


async def _state_is(app: aqw.App, job_id: str, state: str) -> bool:
    info = await app.job(job_id)
    return info is not None and info.state == state


async def test_results_plain_not_kept_too_big_and_not_json(backend: Backend) -> None:
    app = backend.app()

    @app.task(name="plain", keep_result=True)
    async def plain(n: int) -> dict[str, Any]:
        return {"n": n, "items": [n, n + 1]}

    @app.task(name="unkept")
    async def unkept() -> int:
        return 7

    @app.task(name="big", keep_result=True, max_result_bytes=100)
    async def big() -> str:
        return "x" * 1000

    @app.task(name="odd", keep_result=True)
    async def odd() -> object:
        return object()

    ids = [
        await plain.enqueue(4),
        await unkept.enqueue(),
        await big.enqueue(),
        await odd.enqueue(),
    ]
    worker = await run_burst(app)
    assert worker.stats.processed == 4 and worker.stats.dead == 0
    assert await app.result(ids[0], timeout=1) == {"n": 4, "items": [4, 5]}
    assert await app.result(ids[1], timeout=1) is None
    with pytest.raises(aqw.ResultNotKept, match="over max_result_bytes of 100"):
        await app.result(ids[2], timeout=1)
    with pytest.raises(aqw.ResultNotKept, match="not JSON"):
        await app.result(ids[3], timeout=1)
    info = await app.job(ids[3])
    assert info is not None and info.state == "succeeded" and not info.has_result


async def test_result_bad_arguments_fail_fast(backend: Backend) -> None:
    app = backend.app()
    for bad in (0, -1, float("nan"), "1"):
        with pytest.raises(aqw.ConfigError, match="timeout"):
            await app.result("x", timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(aqw.ConfigError, match="job id"):
        await app.job("")
    with pytest.raises(aqw.UnknownJob, match="never enqueued"):
        await app.result("made-up", timeout=1)
    assert await app.cancel("made-up") == "unknown"

    @app.task(name="work")
    async def work() -> None: ...

    for bad in (-1, 0, float("inf"), True):
        with pytest.raises(aqw.ConfigError, match="expires"):
            await work.enqueue(expires=bad)
    with pytest.raises(aqw.ConfigError, match="keep_for"):

        @app.task(name="t", keep_for=0)
        async def t() -> None: ...


async def test_two_hundred_waiters_each_get_their_own_result(backend: Backend) -> None:
    app = backend.app()

    @app.task(name="square", keep_result=True)
    async def square(n: int) -> int:
        await asyncio.sleep(0.001)
        return n * n

    ids = [await square.enqueue(n) for n in range(200)]
    waiters = [asyncio.ensure_future(app.result(job_id, timeout=30)) for job_id in ids]
    await asyncio.sleep(0.05)  # every waiter is registered before the first job ends
    assert not any(w.done() for w in waiters)
    await run_burst(app, concurrency=50)
    values = await asyncio.wait_for(asyncio.gather(*waiters), 20)
    assert values == [n * n for n in range(200)]
    # A waiter that starts after the job finished gets the value at once: nothing will push
    # that end again, so a waiter that waited for a push would time out instead.
    assert await app.result(ids[7], timeout=5) == 49


async def test_cancel_a_queued_and_a_delayed_job_they_never_run(backend: Backend) -> None:
    app = backend.app()
    ran: list[int] = []

    @app.task(name="work")
    async def work(n: int) -> None:
        ran.append(n)

    queued = await work.enqueue(1)
    delayed = await work.enqueue(2, delay=0.2)
    other = await work.enqueue(3)
    waiter = asyncio.ensure_future(app.result(queued, timeout=10))
    assert await app.cancel(queued) == "cancelled"
    assert await app.cancel(delayed) == "cancelled"
    with pytest.raises(aqw.JobCancelled):
        await asyncio.wait_for(waiter, 5)
    await asyncio.sleep(0.3)
    worker = await run_burst(app)
    assert ran == [3]
    assert worker.stats.cancelled == 2 and worker.stats.dead == 0 and worker.stats.retried == 0
    for job_id in (queued, delayed):
        info = await app.job(job_id)
        assert info is not None and info.state == "cancelled" and info.attempts == 0
    assert await app.dlq.list() == []
    assert await app.cancel(other) == "finished"
    info = await app.job(other)
    assert info is not None and info.state == "succeeded"


@pytest.mark.parametrize("swallow", [False, True], ids=["plain", "swallows-the-cancel"])
async def test_cancel_a_running_job_within_one_renewal(backend: Backend, swallow: bool) -> None:
    ttl = 0.9  # renewals every 0.3 s
    app = backend.app(lease_ttl=ttl, retry=FAST_RETRY)
    started = asyncio.Event()
    stopped: list[float] = []
    seen_flag: list[bool] = []

    @app.task(name="long")
    async def long(ctx: aqw.Context) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.append(time.monotonic())
            seen_flag.append(ctx.cancelled)
            if not swallow:
                raise
        await asyncio.sleep(30)  # a handler that swallowed the stop is stopped again

    job_id = await long.enqueue()
    async with running(app.worker()) as worker:
        await asyncio.wait_for(started.wait(), 10)
        asked = time.monotonic()
        assert await app.cancel(job_id) == "cancelling"
        info = await app.job(job_id)
        assert info is not None and info.state == "running" and info.cancel_requested
        with pytest.raises(aqw.JobCancelled):
            await app.result(job_id, timeout=10)
        assert stopped and stopped[0] - asked <= ttl / 3 + 0.25, stopped[0] - asked
        assert seen_flag == [True]
        await eventually(lambda: worker.stats.cancelled == 1, 5, "counted")
        assert worker.stats.retried == 0 and worker.stats.dead == 0
    info = await app.job(job_id)
    assert info is not None and info.state == "cancelled" and info.attempts == 1
    assert await app.dlq.list() == []
    depth = await app.broker.depth()
    assert depth.waiting == 0 and depth.delayed == 0 and depth.in_flight == 0


async def test_a_job_delayed_past_its_expiry_ends_expired(backend: Backend) -> None:
    app = backend.app()
    ran: list[str] = []

    @app.task(name="work")
    async def work(tag: str) -> None:
        ran.append(tag)

    late = await work.enqueue("late", delay=0.3, expires=0.1)
    soon = await work.enqueue("soon", expires=60)
    await asyncio.sleep(0.4)
    worker = await run_burst(app)
    assert ran == ["soon"] and worker.stats.expired == 1
    info = await app.job(late)
    assert info is not None and info.state == "expired" and info.attempts == 0
    assert info.expires_at is not None
    with pytest.raises(aqw.JobExpired):
        await app.result(late, timeout=1)
    assert await app.dlq.list() == []
    info = await app.job(soon)
    assert info is not None and info.state == "succeeded"


async def test_records_expire_after_keep_for(backend: Backend) -> None:
    app = backend.app(keep_for=1.0)

    @app.task(name="work", keep_result=True)
    async def work() -> int:
        return 1

    async with clock_for(backend):  # memory: the second passes without waiting
        job_id = await work.enqueue()
        async with running(app.worker()):
            assert await app.result(job_id, timeout=5) == 1
            ended = asyncio.get_running_loop().time()
            assert await app.job(job_id) is not None
        await asyncio.sleep(max(0.0, ended + 1.3 - asyncio.get_running_loop().time()))
        assert await app.job(job_id) is None
    if backend.raw is not None:
        left = [
            k
            async for k in backend.raw.scan_iter(
                match=f"aqw:{{{backend.queue}}}:*{job_id}*", count=1000
            )
        ]
        assert left == []
