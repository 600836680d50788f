"""Flows (``aqw.Flow``, ``app.start``) on every backend with a ``BatchCounts`` part: a chain
whose steps get their parent's result as their typed input, a fan-in that gets a mapping of
step name to result, a failed parent that cancels its dependants (unless
``allow_failed``), each step enqueued once."""

from __future__ import annotations

import asyncio

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
