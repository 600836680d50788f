"""The dashboard's queue controls and views (``aqw/dashboard/_controls.py``) through httpx's
ASGI transport on the in-process broker, fakeredis and the real Redis: the waiting list per
priority level and its pages, pause and resume (a worker stops fetching), deleting a waiting
job and running a delayed one now (each asking first, each refused when read-only), the
rates page over 1 h / 24 h / 7 d with per-task counts and p50/p99, and the payload of a
waiting, running and delayed job on its page, with secret-looking keys hidden."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import pytest
import redis
from pydantic import BaseModel

import aqw
from aqw.dashboard import create_app
from aqw.dashboard._queries import PAGE
from tests._helpers import eventually
from tests.conftest import Backend, PrivateRedis
from tests.test_dashboard import _commands, _fill, _sent

pytestmark = pytest.mark.timeout(60)


class Order(BaseModel):
    name: str
    api_key: str = ""
    qty: int = 1


def client(web: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=web), base_url="http://dash.test")


def make_app(backend: Backend) -> tuple[aqw.App, Any]:
    app = backend.app()

    @app.task(name="order")
    async def order(data: Order) -> None: ...

    return app, order


async def test_waiting_list_per_level_with_pages(backend: Backend) -> None:
    app, order = make_app(backend)
    ids = [await order.enqueue(Order(name=f"n{i}")) for i in range(PAGE + 3)]
    urgent = await order.enqueue(Order(name="urgent"), priority=7)
    async with client(create_app(app)) as c:
        first = await c.get("/waiting")
        assert first.status_code == 200
        levels = first.text.split('id="levels"')[1].split("</p>")[0]
        assert "priority 7 <small>1</small>" in levels
        assert f"priority 0 <small>{PAGE + 3}</small>" in levels
        shown = re.findall(r'name="job_id" value="([^"]+)"', first.text)
        assert shown == ids[:PAGE]
        [after] = re.findall(r"after=([0-9]+-[0-9]+)", first.text)
        second = await c.get(f"/waiting?level=0&after={after}")
        assert re.findall(r'name="job_id" value="([^"]+)"', second.text) == ids[PAGE:]
        top = await c.get("/waiting?level=7")
        assert re.findall(r'name="job_id" value="([^"]+)"', top.text) == [urgent]
        for bad in ("level=10", "level=x", "after=nope"):
            r = await c.get(f"/waiting?{bad}")
            assert r.status_code == 400, bad


async def test_delete_asks_first_then_deletes_the_waiting_job(backend: Backend) -> None:
    app, order = make_app(backend)
    keep = await order.enqueue(Order(name="keep"))
    gone = await order.enqueue(Order(name="gone"))
    async with client(create_app(app)) as c:
        page = await c.get("/waiting")
        [entry] = re.findall(
            rf'name="entry" value="([^"]+)"><input type="hidden" name="level" value="0">'
            rf'<input type="hidden" name="job_id" value="{gone}"',
            page.text,
        )
        form = {"entry": entry, "level": "0", "job_id": gone}
        ask = await c.post("/actions/delete", data=form)
        assert ask.status_code == 200 and f"Delete waiting job {gone}?" in ask.text
        assert (await app.broker.depth()).waiting == 2
        done = await c.post("/actions/delete", data={**form, "confirm": "yes"})
        assert done.status_code == 200 and "deleted" in done.text
        after = await c.get("/waiting")
        assert re.findall(r'name="job_id" value="([^"]+)"', after.text) == [keep]
    info = await app.job(gone)
    assert info is not None and info.state == "cancelled"
    assert (await app.broker.depth()).waiting == 1


async def test_promote_runs_a_delayed_job_now(backend: Backend) -> None:
    app, order = make_app(backend)
    later = await order.enqueue(Order(name="later"), delay=3600)
    async with client(create_app(app)) as c:
        delayed = await c.get("/delayed")
        assert "Run now" in delayed.text
        ask = await c.post("/actions/promote", data={"job_id": later})
        assert "Run delayed job" in ask.text
        assert (await app.broker.depth()).delayed == 1
        done = await c.post("/actions/promote", data={"job_id": later, "confirm": "yes"})
        assert done.status_code == 200 and "due now" in done.text
        async with app.worker(burst=True) as worker:
            await asyncio.wait_for(worker.wait_stopped(), 20)
        info = await app.job(later)
        assert info is not None and info.state == "succeeded"
        again = await c.post("/actions/promote", data={"job_id": later, "confirm": "yes"})
        assert again.status_code == 404


async def test_pause_and_resume_from_the_overview(backend: Backend) -> None:
    app, _ = make_app(backend)
    ran: list[str] = []

    @app.task(name="note")
    async def note(n: int) -> None:
        ran.append(str(n))

    async with client(create_app(app)) as c:
        overview = await c.get("/")
        assert 'id="pause"' in overview.text and "<b>running</b>" in overview.text
        ask = await c.post("/actions/pause", data={})
        assert f"Pause queue {app.queue}?" in ask.text
        assert app.broker.control is not None and not await app.broker.control.paused()
        done = await c.post("/actions/pause", data={"confirm": "yes"})
        assert "paused: workers fetch no more jobs" in done.text
        assert await app.broker.control.paused()
        overview = await c.get("/")
        assert 'id="resume"' in overview.text and ">paused</b>" in overview.text
        await note.enqueue(1)
        async with app.worker(heartbeat=0.2) as worker:
            await eventually(lambda: worker.intake.paused, 5, "the worker sees the pause")

            async def shown_paused() -> bool:
                page = await c.get("/workers")
                return '<span class="tag">paused</span>' in page.text

            await eventually(shown_paused, 10, "the workers page to show the paused worker")
            assert ran == []
            await c.post("/actions/resume", data={"confirm": "yes"})
            await eventually(lambda: ran == ["1"], 10, "the job runs after resume")
        assert not await app.broker.control.paused()


async def test_read_only_refuses_the_controls(backend: Backend) -> None:
    app, order = make_app(backend)
    later = await order.enqueue(Order(name="later"), delay=3600)
    await order.enqueue(Order(name="now"))
    async with client(create_app(app, read_only=True)) as c:
        for path in ("/", "/waiting", "/delayed"):
            page = await c.get(path)
            assert "<button" not in page.text.split("<main>")[1], path
        for path, form in (
            ("/actions/pause", {"confirm": "yes"}),
            ("/actions/resume", {"confirm": "yes"}),
            ("/actions/promote", {"job_id": later, "confirm": "yes"}),
            ("/actions/delete", {"entry": "1-0", "level": "0", "job_id": "x", "confirm": "yes"}),
        ):
            r = await c.post(path, data=form)
            assert r.status_code == 403 and "read-only" in r.text, path
    assert app.broker.control is not None and not await app.broker.control.paused()
    depth = await app.broker.depth()
    assert (depth.waiting, depth.delayed) == (1, 1)


async def test_rates_page_counts_per_task_with_quantiles(backend: Backend) -> None:
    app, order = make_app(backend)

    @app.task(name="broken", max_retries=0)
    async def broken(n: int) -> None:
        raise ValueError("no")

    for i in range(3):
        await order.enqueue(Order(name=f"n{i}"))
    await broken.enqueue(1)
    async with app.worker(burst=True, heartbeat=0.2) as worker:
        await asyncio.wait_for(worker.wait_stopped(), 20)
    async with client(create_app(app)) as c:
        for name in ("1h", "24h", "7d"):
            page = await c.get(f"/rates?range={name}")
            assert page.status_code == 200, name
            rows = page.text.split('id="tasks"')[1]
            order_row = rows.split("<td>order</td>")[1].split("</tr>")[0]
            assert '<td class="num" data-count="processed">3</td>' in order_row
            assert " ms</td>" in order_row  # p50 and p99 are shown
            broken_row = rows.split("<td>broken</td>")[1].split("</tr>")[0]
            assert '<td class="num" data-count="failed">1</td>' in broken_row
            assert '<td class="num" data-count="dead">1</td>' in broken_row
            assert "100%" in broken_row
            assert 'data-series="finished"' in page.text
        assert (await c.get("/rates?range=2h")).status_code == 400


async def test_job_page_shows_the_payload_while_it_waits_runs_or_is_delayed(
    backend: Backend,
) -> None:
    app = backend.app()
    started, release = asyncio.Event(), asyncio.Event()

    @app.task(name="hold", lease_ttl=5.0)
    async def hold(data: Order) -> None:
        started.set()
        await release.wait()

    waiting = await hold.enqueue(Order(name="<b>waits</b>", api_key="s3cr3t"))
    delayed = await hold.enqueue(Order(name="later"), delay=3600)
    async with client(create_app(app)) as c:
        page = await c.get(f"/jobs/{waiting}")
        payload = page.text.split('id="payload">')[1].split("</pre>")[0]
        assert "&lt;b&gt;waits&lt;/b&gt;" in payload and "s3cr3t" not in page.text
        assert '"api_key": "***"' in payload.replace("&#34;", '"')
        page = await c.get(f"/jobs/{delayed}")
        assert '"later"' in page.text.replace("&#34;", '"')
        async with app.worker(concurrency=1) as worker:
            await asyncio.wait_for(started.wait(), 20)
            page = await c.get(f"/jobs/{waiting}")
            assert 'id="job-state">running' in page.text
            assert "&lt;b&gt;waits&lt;/b&gt;" in page.text and "s3cr3t" not in page.text
            release.set()
            await eventually(lambda: _state(app, waiting, "succeeded"), 20, "it ends")
            await worker.stop()
        page = await c.get(f"/jobs/{waiting}")
        assert 'id="no-payload"' in page.text


async def _state(app: aqw.App, job_id: str, state: str) -> bool:
    info = await app.job(job_id)
    return info is not None and info.state == state


#: Most Redis commands (scripts' inner commands included) each page sends, whatever the
#: queue holds: the rates pages read one hash per minute (1 h) or hour (7 d), in one
#: round trip.
BOUNDS = {"/waiting": 6, "/waiting?level=3": 6, "/rates?range=1h": 62, "/rates?range=7d": 170}


@pytest.mark.redis
async def test_the_pages_cost_a_bounded_number_of_commands(private_redis: PrivateRedis) -> None:
    raw = redis.Redis.from_url(private_redis.url)
    counts: dict[int, dict[str, int]] = {}
    for n in (10, 100_000):
        app = await _fill(private_redis.url, f"size-{n}", n)
        async with client(create_app(app)) as c:
            await c.get("/")  # connects
            counts[n] = {}
            for path in BOUNDS:
                await c.get(path)  # the levels are read at most once a second: warm them
                before = _commands(raw)
                assert (await c.get(path)).status_code == 200
                counts[n][path] = sum(_sent(before, _commands(raw)).values())
        await app.close()
    raw.close()
    for path, bound in BOUNDS.items():
        assert counts[10][path] == counts[100_000][path] <= bound, (path, counts)
