"""The dashboard's batch and flow pages (``/batches/<id>``, ``/flows/<id>``) through httpx's
ASGI transport, on the in-process broker and the real Redis: a batch's progress, counts,
children by state and callbacks; a flow's DAG as SVG with each step's state; the link from
a child's job page; 400 / 404 pages; a step name escaped in the SVG."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis

import aqw
from aqw.dashboard import create_app
from aqw.dashboard._dag import Node, depths, flow_chart
from aqw.dashboard._queries import PAGE
from tests.conftest import Backend, PrivateRedis, open_backend

BACKENDS = ["memory", pytest.param("redis", marks=pytest.mark.redis)]


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, queue_name: str) -> AsyncIterator[Backend]:
    async with open_backend(request.param, queue_name) as b:
        yield b


def client(app: aqw.App) -> httpx.AsyncClient:
    web = create_app(app)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=web), base_url="http://dash.test")


def _wire(app: aqw.App) -> dict[str, aqw.Task[Any]]:
    @app.task(name="child", keep_result=True, max_retries=0)
    async def child(n: int) -> int:
        if n < 0:
            raise ValueError("negative")
        return n

    @app.task(name="done")
    async def done(n: int) -> None:
        return None

    @app.task(name="join", keep_result=True)
    async def join(parts: dict[str, int]) -> int:
        return sum(parts.values())

    return {"child": child, "done": done, "join": join}


async def _drain(app: aqw.App) -> None:
    async with asyncio.timeout(60):
        await app.worker(concurrency=4, burst=True).run()


async def test_a_batch_page_shows_progress_counts_children_and_callbacks(
    backend: Backend,
) -> None:
    app = backend.app()
    t = _wire(app)
    async with app.batch(on_complete=t["done"], on_failure=t["done"], payload=0) as batch:
        ids = await batch.enqueue_many(t["child"], [1, 2, -1])
    async with client(app) as http:
        # before any worker ran: the child's job page links to its batch
        page = await http.get(f"/jobs/{ids[0]}")
        assert page.status_code == 200
        assert f'<th>batch</th><td><a id="job-batch" href="/batches/{batch.id}">' in page.text
        before = await http.get(f"/batches/{batch.id}")
        assert before.status_code == 200
        assert 'id="batch-state">sealed<' in before.text
        assert 'value="0"' in before.text and "0/3 done" in before.text
        assert 'id="no-callbacks"' in before.text
        assert re.search(r'data-state="queued".*?</table>', before.text, re.S)

        await _drain(app)
        page = await http.get(f"/batches/{batch.id}")
    assert page.status_code == 200
    html = page.text
    assert 'id="batch-state">complete<' in html
    assert '<progress id="batch-progress" max="3" value="3">' in html
    counts = dict(re.findall(r"<tr><th>([a-z ()]+)</th><td>(\d+)</td></tr>", html))
    assert counts == {
        "total": "3",
        "pending": "0",
        "succeeded": "2",
        "failed (dead)": "1",
        "cancelled": "0",
        "expired": "0",
    }
    children = r'<table class="children" data-state="(\w+)">(.*?)</table>'
    tables = dict(re.findall(children, html, re.S))
    assert set(tables) == {"succeeded", "dead"}
    assert tables["succeeded"].count("/jobs/") == 2 and ids[2] in tables["dead"]
    info = await app.batch_info(batch.id)
    assert info is not None and set(info.callbacks) == {"complete", "failure"}
    for kind, job_id in info.callbacks.items():
        assert f'on_{kind}</td><td><a href="/jobs/{job_id}">' in html
    assert 'id="flow-link"' not in html


async def test_a_flow_page_draws_the_dag_with_each_steps_state(backend: Backend) -> None:
    app = backend.app()
    t = _wire(app)
    flow = aqw.Flow()
    a = flow.add(t["child"], 1, name="a")
    b = flow.add(t["child"], 2, name="b")
    bad = flow.add(t["child"], -1, name="<i>bad</i>")
    flow.add(t["join"], after=[a, b], name="sum")
    flow.add(t["join"], after=[bad], name="never")
    handle = await app.start(flow)
    async with client(app) as http:
        started = await app.flow_info(handle.id)
        assert started is not None
        step = await http.get(f"/jobs/{started.steps['a'].job_id}")  # queued: its envelope
        assert f'<th>flow</th><td><a id="job-batch" href="/flows/{handle.id}">' in step.text
        first = await http.get(f"/flows/{handle.id}")
        assert first.status_code == 200
        assert re.search(r'data-step="sum" data-state="waiting"', first.text)
        await _drain(app)
        page = await http.get(f"/flows/{handle.id}")
        as_batch = await http.get(f"/batches/{handle.id}")
    html = page.text
    assert page.status_code == 200 and 'id="flow-state">complete<' in html
    steps = dict(re.findall(r'<g class="step" data-step="([^"]+)" data-state="(\w+)">', html))
    assert steps == {
        "a": "succeeded",
        "b": "succeeded",
        "&lt;i&gt;bad&lt;/i&gt;": "dead",
        "sum": "succeeded",
        "never": "cancelled",
    }
    assert "<i>bad</i>" not in html  # the step name escaped, in the SVG and the table
    edges = set(re.findall(r'data-edge="([^"]+)"', html))
    assert edges == {"a&gt;sum", "b&gt;sum", "&lt;i&gt;bad&lt;/i&gt;&gt;never"}
    assert as_batch.status_code == 200 and f'href="/flows/{handle.id}"' in as_batch.text


async def test_a_batch_step_links_to_its_batch_page(backend: Backend) -> None:
    app = backend.app()
    t = _wire(app)

    @app.task(name="total", keep_result=True)
    async def total(values: list[int]) -> int:
        return sum(values)

    flow = aqw.Flow()
    fan = flow.batch(t["child"], [1, 2, 3], name="fan")
    flow.add(total, after=fan)
    handle = await app.start(flow)
    await _drain(app)
    info = await app.flow_info(handle.id)
    assert info is not None
    batch_id = info.steps["fan"].job_id
    async with client(app) as http:
        page = await http.get(f"/flows/{handle.id}")
        batch = await http.get(f"/batches/{batch_id}")
    assert page.status_code == 200
    steps = dict(re.findall(r'<g class="step" data-step="([^"]+)" data-state="(\w+)">', page.text))
    assert steps == {"fan": "succeeded", "total": "succeeded"}
    assert f'href="/batches/{batch_id}"' in page.text  # the step's box and its table row
    assert f'href="/jobs/{batch_id}"' not in page.text
    assert batch.status_code == 200 and 'id="batch-state">complete<' in batch.text
    assert '<progress id="batch-progress" max="3" value="3">' in batch.text


async def test_unknown_and_bad_ids(backend: Backend) -> None:
    app = backend.app()
    _wire(app)
    async with app.batch() as batch:
        pass
    async with client(app) as http:
        assert (await http.get("/batches/no-such-batch")).status_code == 404
        assert (await http.get("/flows/no-such-flow")).status_code == 404
        # a plain batch is not a flow
        assert (await http.get(f"/flows/{batch.id}")).status_code == 404
        bad = await http.get(f"/batches/{batch.id}?start=x")
        assert bad.status_code == 400 and "start must be an offset" in bad.text
        assert (await http.get("/batches/" + "x" * 201)).status_code == 400
        empty = await http.get(f"/batches/{batch.id}")
    assert empty.status_code == 200 and 'id="no-children"' in empty.text
    assert 'id="batch-state">complete<' in empty.text


def test_depths_put_each_step_one_past_its_deepest_parent() -> None:
    assert depths({"a": [], "b": ["a"], "c": ["a", "b"], "d": []}) == {
        "a": 0,
        "b": 1,
        "c": 2,
        "d": 0,
    }
    svg = flow_chart([Node("a", [], "succeeded"), Node("b", ["a"], "running", "/jobs/x")])
    assert svg.count('class="step"') == 2 and '<a href="/jobs/x">' in svg
    assert 'data-edge="a&gt;b"' in svg


def _calls(client: redis.Redis) -> int:
    stats: Any = client.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


@pytest.mark.redis
async def test_the_batch_and_flow_pages_cost_a_bounded_number_of_commands(
    private_redis: PrivateRedis,
) -> None:
    raw = redis.Redis.from_url(private_redis.url)
    sent: dict[int, dict[str, int]] = {}
    for n in (PAGE + 10, 10 * PAGE):
        app = aqw.App(private_redis.url, queue=f"size-{n}")
        t = _wire(app)
        async with app.batch(on_complete=t["done"], payload=0) as batch:
            await batch.enqueue_many(t["child"], list(range(n)))
        flow = aqw.Flow()
        flow.add(t["done"], after=flow.add(t["child"], 1))
        handle = await app.start(flow)
        sent[n] = {}
        async with client(app) as http:
            await http.get("/")  # connects
            for path in (f"/batches/{batch.id}", f"/flows/{handle.id}"):
                before = _calls(raw)
                assert (await http.get(path)).status_code == 200
                sent[n][path.split("/")[1]] = _calls(raw) - before - 1  # less the INFO
        await app.close()
    raw.close()
    small, large = sent[PAGE + 10], sent[10 * PAGE]
    assert small == large, sent  # one page of children, whatever the batch's size
    assert small["batches"] <= 3 + PAGE and small["flows"] <= 2 + 2, sent
