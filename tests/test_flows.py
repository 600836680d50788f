"""Flows (``aqw.Flow``, ``app.start``) on every backend with a ``BatchCounts`` part: a chain
whose steps get their parent's result as their typed input, a fan-in that gets a mapping of
step name to result, a failed parent that cancels its dependants (unless
``allow_failed``), each step enqueued once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

import aqw
from tests.conftest import Backend


class Source(BaseModel):
    url: str


class Parsed(BaseModel):
    url: str
    size: int


async def _drain(app: aqw.App) -> None:
    async with asyncio.timeout(60):
        await app.worker(concurrency=10, burst=True).run()


async def test_a_chain_passes_typed_results_along(backend: Backend) -> None:
    app = backend.app()
    runs: list[str] = []

    @app.task(keep_result=True)
    async def fetch(src: Source) -> Parsed:
        runs.append("fetch")
        return Parsed(url=src.url, size=len(src.url))

    @app.task(keep_result=True)
    async def parse(data: Parsed) -> int:
        runs.append("parse")
        assert isinstance(data, Parsed)
        return data.size * 10

    @app.task(keep_result=True)
    async def store(rows: int) -> str:
        runs.append("store")
        return f"stored {rows}"

    flow = aqw.Flow()
    raw = flow.add(fetch, Source(url="https://x.test/abc"))
    rows = flow.add(parse, after=raw)
    flow.add(store, after=[rows])
    handle = await app.start(flow)
    info = await handle.info()
    assert info is not None
    assert {n: s.state for n, s in info.steps.items()} == {
        "fetch": "queued",
        "parse": "waiting",
        "store": "waiting",
    }
    await _drain(app)
    assert await handle.result(timeout=30) == "stored 180"  # len("https://x.test/abc") * 10
    assert runs == ["fetch", "parse", "store"]
    info = await app.flow_info(handle.id)
    assert info is not None and info.state == "complete"
    assert {s.state for s in info.steps.values()} == {"succeeded"}
    assert info.batch.succeeded == 3 and info.batch.total == 3


async def test_a_fan_in_gets_each_parents_result_by_name(backend: Backend) -> None:
    app = backend.app()

    @app.task(keep_result=True)
    async def left() -> int:
        return 1

    @app.task(keep_result=True)
    async def right() -> int:
        return 2

    @app.task(keep_result=True)
    async def join(parts: dict[str, int]) -> int:
        return parts["left"] * 10 + parts["right"]

    flow = aqw.Flow()
    a, b = flow.add(left), flow.add(right)
    flow.add(join, after=[a, b])
    handle = await app.start(flow)
    await _drain(app)
    assert await handle.result(timeout=30) == 12


async def test_a_failed_parent_cancels_its_dependants(backend: Backend) -> None:
    app = backend.app()
    ran: list[str] = []

    @app.task(keep_result=True, max_retries=0)
    async def boom() -> int:
        raise ValueError("no")

    @app.task(keep_result=True)
    async def after_boom(x: int | None) -> int:
        ran.append("after_boom")
        return 1

    @app.task(keep_result=True)
    async def last(x: int | None) -> str:
        ran.append("last")
        return "x"

    @app.task(keep_result=True)
    async def tolerant(x: int | None) -> str:
        ran.append("tolerant")
        return f"got {x}"

    flow = aqw.Flow()
    b = flow.add(boom)
    mid = flow.add(after_boom, after=b)
    flow.add(last, after=mid)
    flow.add(tolerant, after=b, allow_failed=True)
    handle = await app.start(flow)
    await _drain(app)
    with pytest.raises(aqw.JobCancelled):  # a last step, "last", was cancelled
        await handle.result(timeout=30)
    info = await app.flow_info(handle.id)
    assert info is not None and info.state == "complete"
    states = {n: s.state for n, s in info.steps.items()}
    assert states == {
        "boom": "dead",
        "after_boom": "cancelled",
        "last": "cancelled",
        "tolerant": "succeeded",
    }
    assert ran == ["tolerant"]
    assert info.steps["tolerant"].record is not None
    assert info.steps["tolerant"].record.result == "got None"
    assert (info.batch.failed, info.batch.cancelled, info.batch.succeeded) == (1, 2, 1)


async def test_flow_definition_errors(backend: Backend) -> None:
    app = backend.app()

    @app.task
    async def forgetful() -> int:
        return 1

    @app.task(keep_result=True)
    async def other(x: int) -> int:
        return x

    flow = aqw.Flow()
    f = flow.add(forgetful)
    with pytest.raises(aqw.ConfigError, match="keep_result=True"):
        flow.add(other, after=f)
    with pytest.raises(aqw.ConfigError, match="exists"):
        flow.add(forgetful)
    o = flow.add(other, 3)
    with pytest.raises(aqw.ConfigError, match="takes no payload"):
        flow.add(other, 4, after=o, name="again")
    with pytest.raises(aqw.ConfigError, match="this flow"):
        aqw.Flow().add(other, after=o)
    assert await app.flow_info("no-such-flow") is None


class Image(BaseModel):
    id: int


async def test_a_batch_step_fans_out_and_its_dependant_gets_every_result(
    backend: Backend,
) -> None:
    """fetch -> a batch of resize children (after fetch) -> summarize: summarize runs once,
    after every child is final, with the children's results in order; a root batch step's
    dependant too. Each batch step's batch is readable as a batch."""
    app = backend.app()
    ran: list[str] = []
    seen: dict[str, object] = {}
    flow_id: list[str] = []

    @app.task(keep_result=True)
    async def fetch() -> int:
        ran.append("fetch")
        return 7

    @app.task(keep_result=True)
    async def resize(image: Image) -> int:
        ran.append(f"resize {image.id}")
        return image.id * 10

    @app.task(keep_result=True)
    async def summarize(sizes: list[int]) -> int:
        ran.append("summarize")
        info = await app.flow_info(flow_id[0])  # every child is final by now
        assert info is not None
        batch = info.steps["resize"].batch
        assert batch is not None and batch.pending == 0 and batch.succeeded == 6
        seen["sizes"] = sizes
        return sum(sizes)

    @app.task(keep_result=True)
    async def tally(parts: dict[str, Any]) -> str:
        ran.append("tally")
        return f"{parts['fetch']} {parts['thumbs']}"

    flow = aqw.Flow()
    first = flow.add(fetch)
    sized = flow.batch(resize, [Image(id=i) for i in range(1, 7)], after=first)
    flow.add(summarize, after=sized)
    thumbs = flow.batch(resize, [Image(id=100), Image(id=200)], name="thumbs")
    flow.add(tally, after=[first, thumbs])
    handle = await app.start(flow)
    flow_id.append(handle.id)
    info = await handle.info()
    assert info is not None
    assert info.steps["resize"].state == "waiting"  # fetch has not run
    assert info.steps["thumbs"].state == "queued"
    assert info.steps["summarize"].state == "waiting"
    await _drain(app)
    assert await handle.result(timeout=30) == {"summarize": 210, "tally": "7 [1000, 2000]"}
    assert seen["sizes"] == [10, 20, 30, 40, 50, 60]
    assert ran.count("summarize") == 1 and ran.count("tally") == 1 and ran.count("fetch") == 1
    resized = [r for r in ran if r.startswith("resize")]
    assert sorted(resized) == sorted(f"resize {i}" for i in (1, 2, 3, 4, 5, 6, 100, 200))
    assert ran.index("summarize") > max(ran.index(f"resize {i}") for i in range(1, 7))
    assert ran.index("fetch") < min(ran.index(f"resize {i}") for i in range(1, 7))
    info = await app.flow_info(handle.id)
    assert info is not None and info.state == "complete"
    assert {n: s.state for n, s in info.steps.items()} == {
        "fetch": "succeeded",
        "resize": "succeeded",
        "summarize": "succeeded",
        "thumbs": "succeeded",
        "tally": "succeeded",
    }
    assert (info.batch.total, info.batch.succeeded) == (11, 11)  # one per job
    step = info.steps["resize"]
    batch = await app.batch_info(step.job_id)
    assert batch is not None and batch.state == "complete"
    assert (batch.total, batch.succeeded, batch.pending) == (6, 6, 0)
    results = await app.batch_results(step.job_id)
    assert list(results.values()) == [10, 20, 30, 40, 50, 60]


async def test_a_failed_child_of_a_batch_step_cancels_its_dependants(backend: Backend) -> None:
    """A child that fails: the dependant without allow_failed ends cancelled, unrun; the
    one with allow_failed runs with None at the failed child's place. A batch step after a
    failed parent ends with every child cancelled, unrun."""
    app = backend.app()
    ran: list[str] = []

    @app.task(keep_result=True, max_retries=0)
    async def resize(image: Image) -> int:
        ran.append(f"resize {image.id}")
        if image.id == 2:
            raise ValueError("bad image")
        return image.id

    @app.task(keep_result=True)
    async def strict(sizes: list[int]) -> int:
        ran.append("strict")
        return 0

    @app.task(keep_result=True)
    async def tolerant(sizes: list[int | None]) -> str:
        ran.append("tolerant")
        return repr(sizes)

    @app.task(keep_result=True, max_retries=0)
    async def boom() -> int:
        raise ValueError("no")

    flow = aqw.Flow()
    sized = flow.batch(resize, [Image(id=i) for i in (1, 2, 3)])
    flow.add(strict, after=sized)
    flow.add(tolerant, after=sized, allow_failed=True)
    never = flow.batch(resize, [Image(id=10), Image(id=11)], after=flow.add(boom), name="never")
    flow.add(strict, after=never, name="after_never")
    handle = await app.start(flow)
    await _drain(app)
    info = await app.flow_info(handle.id)
    assert info is not None and info.state == "complete"
    assert {n: s.state for n, s in info.steps.items()} == {
        "resize": "failed",
        "strict": "cancelled",
        "tolerant": "succeeded",
        "boom": "dead",
        "never": "cancelled",
        "after_never": "cancelled",
    }
    assert info.steps["tolerant"].record is not None
    assert info.steps["tolerant"].record.result == "[1, None, 3]"
    assert "strict" not in ran and "resize 10" not in ran and "resize 11" not in ran
    assert ran.count("tolerant") == 1
    never_batch = info.steps["never"].batch
    assert never_batch is not None and (never_batch.cancelled, never_batch.total) == (2, 2)
    sized_batch = info.steps["resize"].batch
    assert sized_batch is not None
    assert (sized_batch.succeeded, sized_batch.failed) == (2, 1)
    # 5 resize jobs, strict x2, tolerant, boom: 9 jobs, each counted once in the flow
    assert info.batch.total == 9
    assert (info.batch.succeeded, info.batch.failed, info.batch.cancelled) == (3, 2, 4)


async def test_a_fail_fast_batch_step_stops_its_other_children(backend: Backend) -> None:
    """``fail_fast=True``: the first failed child cancels the children not yet started;
    the dependant is cancelled, the flow completes."""
    app = backend.app()
    ran: list[int] = []

    @app.task(keep_result=True, max_retries=0)
    async def resize(image: Image) -> int:
        ran.append(image.id)
        if image.id == 0:
            raise ValueError("bad image")
        return image.id

    @app.task(keep_result=True)
    async def strict(sizes: list[int]) -> int:
        return 0

    flow = aqw.Flow()
    sized = flow.batch(resize, [Image(id=i) for i in range(20)], fail_fast=True)
    flow.add(strict, after=sized)
    handle = await app.start(flow)
    async with asyncio.timeout(60):  # one at a time: child 0 first, the rest after it
        await app.worker(concurrency=1, prefetch=0, burst=True).run()
    info = await app.flow_info(handle.id)
    assert info is not None and info.state == "complete"
    batch = info.steps["resize"].batch
    assert batch is not None and batch.fail_fast
    assert batch.failed == 1 and batch.cancelled >= 1
    assert batch.succeeded + batch.failed + batch.cancelled == 20
    assert len(ran) == batch.succeeded + 1  # the cancelled ones never ran
    assert info.steps["strict"].state == "cancelled"


async def test_batch_step_definition_errors(backend: Backend) -> None:
    app = backend.app()

    @app.task(keep_result=True)
    async def resize(image: Image) -> int:
        return image.id

    flow = aqw.Flow()
    with pytest.raises(aqw.ConfigError, match="at least one payload"):
        flow.batch(resize, [])
    with pytest.raises(aqw.ConfigError, match="must be a list"):
        flow.batch(resize, Image(id=1))  # type: ignore[arg-type]
    with pytest.raises(aqw.ConfigError, match="fail_fast"):
        flow.batch(resize, [Image(id=1)], fail_fast="yes")  # type: ignore[arg-type]
    with pytest.raises(aqw.ConfigError, match="one word"):
        flow.batch(resize, [Image(id=1)], name="x[]")
    flow.batch(resize, [{"id": "not a number"}])
    with pytest.raises(ValueError):  # payloads are checked when the flow starts, first
        await app.start(flow)
