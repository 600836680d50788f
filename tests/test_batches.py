"""Batches (``app.batch``) on every backend with a ``BatchCounts`` part: each child counted
once in its own settle step, the callbacks enqueued exactly once when a sealed batch reaches
zero, ``ctx.batch``, fail_fast, nesting, an empty batch, sealing races, results."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from pydantic import BaseModel

import aqw
from tests.conftest import Backend


class Image(BaseModel):
    id: int


class Report(BaseModel):
    day: str


def _wire(app: aqw.App, seen: dict[str, list[Any]]) -> dict[str, aqw.Task[Any]]:
    @app.task(keep_result=True, max_retries=0)
    async def resize(image: Image) -> int:
        if image.id < 0:
            raise ValueError("bad image")
        return image.id * 2

    async def callback(kind: str, report: Report, ctx: aqw.Context) -> None:
        seen.setdefault(kind, []).append((report.day, ctx.batch))

    @app.task(name="summarize")
    async def summarize(report: Report, ctx: aqw.Context) -> None:
        await callback("complete", report, ctx)

    @app.task(name="publish")
    async def publish(report: Report, ctx: aqw.Context) -> None:
        await callback("success", report, ctx)

    @app.task(name="alert")
    async def alert(report: Report, ctx: aqw.Context) -> None:
        await callback("failure", report, ctx)

    return {"resize": resize, "summarize": summarize, "publish": publish, "alert": alert}


async def _drain(app: aqw.App) -> None:
    async with asyncio.timeout(60):
        await app.worker(concurrency=20, burst=True).run()


async def test_all_succeed_fires_complete_and_success_once(backend: Backend) -> None:
    app = backend.app()
    seen: dict[str, list[Any]] = {}
    t = _wire(app, seen)
    async with app.batch(
        on_complete=t["summarize"],
        on_success=t["publish"],
        on_failure=t["alert"],
        payload=Report(day="2026-12-01"),
    ) as batch:
        first = await batch.enqueue(t["resize"], Image(id=1))
        await batch.enqueue_many(t["resize"], [Image(id=i) for i in range(2, 11)])
    assert batch.info is not None and batch.info.state == "sealed"
    assert batch.info.total == 10 and batch.info.pending == 10
    await _drain(app)
    info = await app.batch_info(batch.id)
    assert info is not None
    assert (info.state, info.total, info.pending, info.succeeded, info.failed) == (
        "complete",
        10,
        0,
        10,
        0,
    )
    assert sorted(info.callbacks) == ["complete", "success"]
    assert sorted(seen) == ["complete", "success"]
    assert len(seen["complete"]) == 1 and len(seen["success"]) == 1
    day, ctx_info = seen["complete"][0]
    assert day == "2026-12-01"
    assert ctx_info is not None and (ctx_info.id, ctx_info.succeeded, ctx_info.total) == (
        batch.id,
        10,
        10,
    )
    results = await app.batch_results(batch.id)
    assert results[first] == 2 and len(results) == 10
    page = await app.batch_results(batch.id, start=8, count=5)
    assert sorted(page.values()) == [18, 20]
    assert (await app.job(info.callbacks["complete"])) is not None


async def test_a_dead_child_fires_failure_not_success(backend: Backend) -> None:
    app = backend.app()
    seen: dict[str, list[Any]] = {}
    t = _wire(app, seen)
    async with app.batch(
        on_complete=t["summarize"],
        on_success=t["publish"],
        on_failure=t["alert"],
        payload=Report(day="d"),
    ) as batch:
        await batch.enqueue_many(t["resize"], [Image(id=1), Image(id=-1), Image(id=3)])
    await _drain(app)
    info = await app.batch_info(batch.id)
    assert info is not None
    assert (info.state, info.succeeded, info.failed, info.pending) == ("complete", 2, 1, 0)
    assert sorted(seen) == ["complete", "failure"]
    assert [len(v) for v in seen.values()] == [1, 1]


async def test_an_empty_batch_completes_at_once(backend: Backend) -> None:
    app = backend.app()
    seen: dict[str, list[Any]] = {}
    t = _wire(app, seen)
    async with app.batch(
        on_complete=t["summarize"], on_success=t["publish"], payload=Report(day="e")
    ) as batch:
        pass
    assert batch.info is not None and batch.info.state == "complete"
    assert sorted(batch.info.callbacks) == ["complete", "success"]
    await _drain(app)
    assert sorted(seen) == ["complete", "success"]


async def test_children_finished_before_the_seal_complete_it_at_the_seal(backend: Backend) -> None:
    app = backend.app()
    seen: dict[str, list[Any]] = {}
    t = _wire(app, seen)
    async with app.batch(on_complete=t["summarize"], payload=Report(day="r")) as batch:
        await batch.enqueue_many(t["resize"], [Image(id=i) for i in range(5)])
        await _drain(app)  # every child ends inside the block: the batch is not sealed yet
        info = await app.batch_info(batch.id)
        assert info is not None and (info.state, info.pending, info.succeeded) == ("open", 0, 5)
        assert seen == {}
    assert batch.info is not None and batch.info.state == "complete"
    await _drain(app)
    assert len(seen["complete"]) == 1


async def test_enqueue_into_a_sealed_batch_is_refused(backend: Backend) -> None:
    app = backend.app()
    t = _wire(app, {})
    async with app.batch() as batch:
        await batch.enqueue(t["resize"], Image(id=1))
    with pytest.raises(aqw.ConfigError, match="seals the batch"):
        await batch.enqueue(t["resize"], Image(id=2))
    with pytest.raises(aqw.ConfigError, match="is sealed"):
        await app.broker.batches.add(batch.id, [])  # type: ignore[union-attr]


async def test_a_nested_batch_counts_once_in_its_parent(backend: Backend) -> None:
    app = backend.app()
    seen: dict[str, list[Any]] = {}
    t = _wire(app, seen)
    async with app.batch(on_complete=t["summarize"], payload=Report(day="outer")) as outer:
        await outer.enqueue(t["resize"], Image(id=1))
        async with outer.batch(on_complete=t["publish"], payload=Report(day="inner")) as inner:
            await inner.enqueue_many(t["resize"], [Image(id=2), Image(id=3)])
    await _drain(app)
    info = await app.batch_info(outer.id)
    inner_info = await app.batch_info(inner.id)
    assert info is not None and inner_info is not None
    assert (inner_info.state, inner_info.succeeded, inner_info.parent) == ("complete", 2, outer.id)
    assert (info.state, info.total, info.succeeded) == ("complete", 2, 2)
    assert [d for d, _ in seen["complete"]] == ["outer"]
    assert [d for d, _ in seen["success"]] == ["inner"]


async def test_fail_fast_cancels_the_children_not_started(backend: Backend) -> None:
    app = backend.app()
    seen: dict[str, list[Any]] = {}
    t = _wire(app, seen)
    async with app.batch(on_failure=t["alert"], payload=Report(day="ff"), fail_fast=True) as batch:
        await batch.enqueue(t["resize"], Image(id=-1))
        await batch.enqueue_many(t["resize"], [Image(id=i) for i in range(1, 21)])
    async with asyncio.timeout(60):
        await app.worker(concurrency=1, burst=True).run()  # the dead one runs first
    info = await app.batch_info(batch.id)
    assert info is not None
    assert (info.state, info.failed, info.pending) == ("complete", 1, 0)
    assert info.cancelled == 20 and info.succeeded == 0
    assert len(seen["failure"]) == 1


async def test_cancel_batch(backend: Backend) -> None:
    app = backend.app()
    seen: dict[str, list[Any]] = {}
    t = _wire(app, seen)
    async with app.batch(on_complete=t["summarize"], payload=Report(day="c")) as batch:
        await batch.enqueue_many(t["resize"], [Image(id=i) for i in range(4)])
    cancelled = await app.cancel_batch(batch.id)
    assert cancelled is not None and cancelled.state == "sealed"
    await _drain(app)
    info = await app.batch_info(batch.id)
    assert info is not None and (info.state, info.cancelled, info.pending) == ("complete", 4, 0)
    assert len(seen["complete"]) == 1
    assert await app.batch_info("no-such-batch") is None


async def test_a_redelivered_child_counts_once(backend: Backend) -> None:
    """A child whose ack is sent twice (a redelivered copy settled again) counts once."""
    app = backend.app()
    t = _wire(app, {})
    async with app.batch() as batch:
        await batch.enqueue(t["resize"], Image(id=1))
    broker = app.broker
    await broker.connect()
    await broker.start_consuming("c1")
    (delivery,) = await broker.fetch(1, 1.0)
    job = aqw.Job.decode(delivery.data)
    assert await broker.ack(delivery, job, None)
    assert not await broker.ack(delivery, job, None)  # refused: settled already
    info = await app.batch_info(batch.id)
    assert info is not None and (info.succeeded, info.state) == (1, "complete")


async def test_a_batch_child_of_another_queue_is_refused(backend: Backend) -> None:
    app = backend.app()

    @app.task(queue="elsewhere")
    async def other() -> None: ...

    async with app.batch() as batch:
        with pytest.raises(aqw.ConfigError, match="share its queue"):
            await batch.enqueue(other)


async def test_a_retried_child_counts_once_at_its_end(backend: Backend) -> None:
    app = backend.app()
    tries: list[int] = []

    @app.task(max_retries=2, retry=aqw.RetryPolicy(base=0.01, cap=0.02))
    async def flaky(n: int) -> None:
        tries.append(n)
        if len(tries) < 3:
            raise ConnectionError("try again")

    async with app.batch() as batch:
        await batch.enqueue(flaky, 1)
    for _ in range(3):
        info = await app.batch_info(batch.id)
        assert info is not None and info.done == 0  # a retry is not an end
        await _drain(app)
        if tries and len(tries) >= 3:
            break
    info = await app.batch_info(batch.id)
    assert info is not None and (info.state, info.succeeded, info.done) == ("complete", 1, 1)
    assert len(tries) == 3


async def test_no_batches_where_the_settle_cannot_count() -> None:
    app = aqw.App("redis://127.0.0.1:6379/0", queue="t-nobatch", partitions=2)

    @app.task
    async def step() -> None: ...

    with pytest.raises(aqw.ConfigError, match="keeps no batch counts"):
        app.batch()
    flow = aqw.Flow()
    flow.add(step)
    with pytest.raises(aqw.ConfigError, match="keeps no batch counts"):
        await app.start(flow)
    await app.close()


async def test_a_child_that_expires_unrun_counts_expired(backend: Backend) -> None:
    app = backend.app()

    @app.task(name="late")
    async def late(n: int) -> None: ...

    async with app.batch() as batch:
        gone = aqw.Job(
            task="late", payload=1, headers={"aqw-batch": batch.id}, expires_at=time.time() - 1
        )
        await app.broker.batches.add(batch.id, [gone])  # type: ignore[union-attr]
        await batch.enqueue(late, 2)
    await _drain(app)
    info = await app.batch_info(batch.id)
    assert info is not None
    assert (info.state, info.expired, info.succeeded, info.total) == ("complete", 1, 1, 2)


async def test_a_failed_nested_batch_fails_fast_its_parent(backend: Backend) -> None:
    app = backend.app()
    t = _wire(app, {})
    async with app.batch(fail_fast=True) as outer:
        async with outer.batch() as inner:
            await inner.enqueue(t["resize"], Image(id=-1))
        await outer.enqueue_many(t["resize"], [Image(id=i) for i in range(1, 11)])
    async with asyncio.timeout(60):
        await app.worker(concurrency=1, burst=True).run()  # the failing child runs first
    info = await app.batch_info(outer.id)
    assert info is not None
    assert (info.state, info.failed, info.cancelled, info.succeeded) == ("complete", 1, 10, 0)


async def test_damage_in_a_batchs_keys_never_fails_its_childs_settle(
    redis_backend: Backend, queue_name: str
) -> None:
    app = redis_backend.app()
    t = _wire(app, {})
    async with app.batch() as batch:
        ids = await batch.enqueue_many(t["resize"], [Image(id=1), Image(id=-1)])
    client = redis_backend.client()
    todo = f"aqw:{{{queue_name}}}:batch:{batch.id}:todo"
    await client.delete(todo)
    await client.set(todo, "not a set")  # someone else's write
    worker = app.worker(concurrency=2, burst=True)
    async with asyncio.timeout(60):
        await worker.run()
    s = worker.stats  # each settle went through: no error, no lease taken for lost
    assert (s.processed, s.dead, s.retried, s.lease_lost, s.failed) == (1, 1, 0, 0, 1)
    states = [(await app.job(i)) for i in ids]
    assert [s.state if s else None for s in states] == ["succeeded", "dead"]
    assert await app.broker.depth() == aqw.QueueDepth(0, 0, 0, 1)
