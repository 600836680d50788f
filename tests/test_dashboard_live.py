"""Live progress on the dashboard's running page (issue 28 item 4, ``aqw/dashboard/_live.py``):
``/running/progress?job=...`` streams the running jobs' ``ctx.progress`` updates as server-
sent events from the broker's progress stream, on the in-process broker, fakeredis and the
real Redis, served by uvicorn so that the events are seen while the job still runs (not
buffered to its end); the last event of each job is its final state and the stream then ends;
a request naming no job, too many, or an unknown one is answered without a reader left."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn

import aqw
from aqw.dashboard import _live as live
from aqw.dashboard import create_app
from aqw.dashboard._queries import PAGE
from tests._helpers import eventually, free_port, running
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(60)


@contextlib.asynccontextmanager
async def serve(web: Any) -> AsyncIterator[str]:
    """``web`` served by uvicorn on a free port in this loop: its base URL."""
    port = free_port()
    config = uvicorn.Config(web, host="127.0.0.1", port=port, lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve())
    try:
        while not server.started:
            assert not task.done(), "uvicorn did not start"
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 20)


async def events(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The (event, data) pairs of a server-sent event stream, as they come."""
    name, data = "message", ""
    async for line in lines:
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
        elif line == "" and data:
            yield name, json.loads(data)
            name, data = "message", ""


async def test_progress_streams_while_the_job_runs_then_its_end(backend: Backend) -> None:
    app = backend.app()
    steps = [asyncio.Event() for _ in range(3)]
    reported: list[float] = []

    @app.task(name="work")
    async def work(n: int, ctx: aqw.Context) -> None:
        for i, step in enumerate(steps):
            reported.append((i + 1) / 4)
            await ctx.progress((i + 1) / 4, f"step {i + 1}")
            await step.wait()

    job_id = str(await work.enqueue(1))
    seen: list[tuple[str, dict[str, Any]]] = []
    async with (
        running(app.worker(concurrency=2)),
        serve(create_app(app)) as base,
        httpx.AsyncClient(base_url=base, timeout=30) as c,
        c.stream("GET", "/running/progress", params={"job": job_id}) as r,
    ):
        try:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            async for event in events(r.aiter_lines()):
                seen.append(event)
                name, data = event
                if name == "progress" and data["state"] is None:
                    # the job waits for this step: the update came while it runs
                    i = round(data["fraction"] * 4) - 1
                    assert reported[-1] == data["fraction"]
                    assert data["message"] == f"step {i + 1}"
                    steps[i].set()
        finally:
            for step in steps:  # a failed check must not leave the job waiting
                step.set()
    progress = [d for n, d in seen if n == "progress"]
    assert [d["job_id"] for d in progress] == [job_id] * len(progress)
    fractions = [d["fraction"] for d in progress if d["state"] is None]
    assert fractions == sorted(fractions) and fractions[-1] == 0.75
    assert progress[-1]["state"] == "succeeded"
    assert seen[-1] == ("end", {})


async def test_two_jobs_on_one_stream_a_finished_one_with_its_end(backend: Backend) -> None:
    app = backend.app()
    gate = asyncio.Event()

    @app.task(name="step")
    async def step(n: int, ctx: aqw.Context) -> None:
        await ctx.progress(0.5, f"half {n}")
        if n == 2:
            await gate.wait()

    done_id = str(await step.enqueue(1))
    async with running(app.worker(concurrency=2)):
        async for p in app.progress(done_id):
            if p.final:
                break
        held_id = str(await step.enqueue(2))
        async with (
            serve(create_app(app)) as base,
            httpx.AsyncClient(base_url=base, timeout=30) as c,
        ):
            params = [("job", done_id), ("job", held_id)]
            got: dict[str, list[dict[str, Any]]] = {done_id: [], held_id: []}
            async with c.stream("GET", "/running/progress", params=params) as r:
                try:
                    async for name, data in events(r.aiter_lines()):
                        if name != "progress":
                            break
                        got[data["job_id"]].append(data)
                        if data["job_id"] == held_id and data["state"] is None:
                            assert (data["fraction"], data["message"]) == (0.5, "half 2")
                            gate.set()
                finally:
                    gate.set()  # a failed check must not leave the job waiting
    assert got[done_id][-1]["state"] == "succeeded" and got[done_id][-1]["fraction"] == 0.5
    assert got[held_id][-1]["state"] == "succeeded"


async def test_bad_requests_and_unknown_jobs(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = backend.app()
    web = create_app(app)
    transport = httpx.ASGITransport(app=web)
    async with httpx.AsyncClient(transport=transport, base_url="http://dash.test") as c:
        assert (await c.get("/running/progress")).status_code == 400
        many = [("job", f"j{i}") for i in range(PAGE + 1)]
        assert (await c.get("/running/progress", params=many)).status_code == 400
        assert (await c.get("/running/progress", params={"job": "x" * 201})).status_code == 400
        # no record of it: its reader ends at once, and so does the stream, with no event
        r = await c.get("/running/progress", params={"job": "nope"})
        assert r.status_code == 200
        assert re.findall(r"^event: (\w+)", r.text, re.M) == ["end"]


async def test_a_stream_ends_after_its_time(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live, "STREAM_FOR", 0.5)
    app = backend.app()
    gate = asyncio.Event()

    @app.task(name="hold")
    async def hold(n: int, ctx: aqw.Context) -> None:
        await ctx.progress(0.1, "started")
        await gate.wait()

    job_id = str(await hold.enqueue(1))
    web = create_app(app)
    async with running(app.worker()):
        async for _ in app.progress(job_id):
            break  # it has started and reported
        transport = httpx.ASGITransport(app=web)
        async with httpx.AsyncClient(transport=transport, base_url="http://dash.test") as c:
            r = await c.get("/running/progress", params={"job": job_id})
        gate.set()
    # the job still ran when the stream ended: its update, no end (the page reopens it)
    assert re.findall(r"^event: (\w+)", r.text, re.M) == ["progress"]
    assert '"fraction": 0.1' in r.text and "retry: 2000" in r.text


def readers() -> list[asyncio.Task[Any]]:
    """The live-progress readers running in this loop."""
    return [
        t
        for t in asyncio.all_tasks()
        if getattr(t.get_coro(), "__qualname__", "").startswith("_stream.<locals>.follow")
    ]


async def test_a_page_that_goes_away_leaves_no_reader(backend: Backend) -> None:
    app = backend.app()
    gate = asyncio.Event()

    @app.task(name="hold")
    async def hold(n: int, ctx: aqw.Context) -> None:
        await ctx.progress(0.2, "started")
        await gate.wait()

    job_id = str(await hold.enqueue(1))
    async with running(app.worker()), serve(create_app(app)) as base:
        try:
            async with (
                httpx.AsyncClient(base_url=base, timeout=30) as c,
                c.stream("GET", "/running/progress", params={"job": job_id}) as r,
            ):
                async for name, data in events(r.aiter_lines()):
                    assert (name, data["fraction"]) == ("progress", 0.2)
                    assert len(readers()) == 1  # the job still runs: its reader reads on
                    break
            # the page went away while the job runs: its reader is stopped, not left reading
            await eventually(lambda: not readers() and not live.STOPPING, 10, "no reader")
        finally:
            gate.set()
