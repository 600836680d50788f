"""The web dashboard (``aqw.dashboard``): every page and action through httpx's ASGI
transport, on the in-process broker, fakeredis and the real Redis; the guards (read-only,
cross-site, auth), escaping, the depth history the workers write, and the bound on Redis
commands per page, counted on a private redis-server against queues of 10 and 100,000 jobs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis
from fastapi import FastAPI
from pydantic import BaseModel

import aqw
from aqw._version import __version__
from aqw.brokers.messages import DEPTH_BUCKET, DEPTH_KEEP
from aqw.brokers.redis import RedisBroker
from aqw.dashboard import create_app
from aqw.dashboard._queries import PAGE
from tests._helpers import REDIS_URL, eventually, free_port, running
from tests.conftest import BACKENDS, Backend, PrivateRedis, open_backend

SCRIPT = "<script>window.__xss = 1</script>"
TRACE = "0af7651916cd43dd8448eb211c80319c"


class Order(BaseModel):
    name: str
    qty: int = 1


def client(web: Any, base: str = "http://dash.test") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=web), base_url=base)


class Scene:
    """An app with a job of each kind: running (held until released), dead (its payload
    holds a script tag), retrying and delayed; a worker runs it."""

    def __init__(self, app: aqw.App) -> None:
        self.app = app
        self.release = asyncio.Event()
        self.started = asyncio.Event()

        @app.task(name="hold", lease_ttl=3.0)
        async def hold(data: Order, ctx: aqw.Context) -> None:
            await ctx.progress(0.5, "half <way>")
            self.started.set()
            await self.release.wait()

        @app.task(name="fail", max_retries=0)
        async def fail(data: Order) -> None:
            raise RuntimeError(f"no stock for {data.name}")

        never = aqw.RetryPolicy(max_retries=3, base=3600, cap=3600, jitter=False)

        @app.task(name="flaky", retry=never)
        async def flaky(data: Order) -> None:
            raise ValueError("try later")

        @app.task(name="tick", schedule=aqw.Every(3600))
        async def tick() -> None:
            return None

        self.hold, self.fail, self.flaky = hold, fail, flaky

    async def fill(self) -> None:
        app = self.app
        headers = {"traceparent": f"00-{TRACE}-b7ad6b7169203331-01"}
        [self.dead_id] = [
            str(e) for e in await app.enqueue(self.fail, [Order(name=SCRIPT)], headers=headers)
        ]
        [self.retry_id] = [str(e) for e in await app.enqueue(self.flaky, [Order(name="f")])]
        [self.later_id] = [
            str(e) for e in await app.enqueue(self.fail, [Order(name="l")], delay=900)
        ]
        [self.run_id] = [str(e) for e in await app.enqueue(self.hold, [Order(name="h")])]

    async def settled(self) -> bool:
        d = await self.app.broker.depth()
        info = await self.app.job(self.run_id)
        beats = await self.app.broker.status.heartbeats()
        seen = any(b.get("in_flight") == 1 for b in beats)  # the worker has told of it too
        return (
            d.dead == 1 and d.delayed == 2 and seen and info is not None and info.state == "running"
        )


@contextlib.asynccontextmanager
async def scene(backend: Backend, **options: Any) -> AsyncIterator[Scene]:
    s = Scene(backend.app())
    await s.fill()
    async with running(s.app.worker(concurrency=4, heartbeat=0.2)):
        await eventually(s.settled, 20, "a running, a dead, a retrying and a delayed job")
        try:
            yield s
        finally:
            s.release.set()


def entry_ids(html: str) -> list[str]:
    return sorted(set(re.findall(r'name="ids" value="([0-9]+-[0-9]+(?:~p[0-9]+)?)"', html)))


@pytest.fixture(params=[*BACKENDS, pytest.param("redis-partitioned", marks=pytest.mark.redis)])
async def any_backend(request: pytest.FixtureRequest, queue_name: str) -> AsyncIterator[Backend]:
    """The backends, and a queue over 3 partitions on the real Redis (its ids and DLQ entry
    ids name their partition: ``~p<N>``)."""
    async with open_backend(request.param, queue_name) as b:
        yield b


# -- pages -------------------------------------------------------------------------------------


async def test_every_page_shows_the_queue(any_backend: Backend) -> None:
    backend = any_backend
    async with (
        scene(backend) as s,
        client(create_app(s.app, trace_url="https://t/{trace_id}")) as c,
    ):
        overview = await c.get("/")
        assert overview.status_code == 200
        assert 'id="count-running">1<' in overview.text
        assert 'id="count-delayed">2<' in overview.text
        assert 'id="count-retrying">1<' in overview.text
        assert 'id="count-dead">1<' in overview.text
        assert "<svg" in overview.text and "No monitor running" in overview.text

        workers = await c.get("/workers")
        assert '<table id="workers"' in workers.text and f"<td>{__version__}</td>" in workers.text
        assert '<td class="num">4</td><td class="num">1</td>' in workers.text, workers.text

        run = await c.get("/running")
        assert s.run_id in run.text and "half &lt;way&gt;" in run.text and "50%" in run.text
        info = await s.app.job(s.run_id)
        assert info is not None and f'<td class="num">{info.fencing_token}</td>' in run.text

        delayed = await c.get("/delayed")
        assert s.retry_id in delayed.text and s.later_id in delayed.text
        assert delayed.text.count('class="tag">retrying<') == 1

        async def leader_shown() -> str:
            page = (await c.get("/schedules")).text
            return page if "Leader: <b>" in page else ""

        schedules = await eventually(leader_shown, 20, "the scheduler's leader")
        assert "<td>tick</td>" in schedules
        assert "every 3600" in schedules.lower()

        dlq = await c.get("/dlq")
        assert (
            "no stock for" in dlq.text and "Traceback" in dlq.text and len(entry_ids(dlq.text)) == 1
        )

        job = await c.get(f"/jobs/{s.dead_id}")
        assert job.status_code == 200 and 'id="job-state">dead<' in job.text
        assert f'href="https://t/{TRACE}"' in job.text
        assert (await c.get("/jobs/no-such-job")).status_code == 404
        found = await c.get("/jobs", params={"id": s.run_id})
        assert found.status_code == 303 and found.headers["location"] == f"/jobs/{s.run_id}"

        health = await c.get("/redis")
        assert health.status_code == 200
        if backend.store == "redis":
            assert "used memory" in health.text and "eviction-warning" not in health.text
        else:
            assert "not available" in health.text or "no Redis server" in health.text


async def test_a_payload_with_a_script_tag_renders_as_text(any_backend: Backend) -> None:
    async with scene(any_backend) as s, client(create_app(s.app)) as c:
        dlq = await c.get("/dlq")
        entry = await c.get(f"/dlq/entry/{entry_ids(dlq.text)[0]}")
        job = await c.get(f"/jobs/{s.dead_id}")
        for page in (dlq, entry, job):
            assert SCRIPT not in page.text
            assert "&lt;script&gt;window.__xss = 1&lt;/script&gt;" in page.text


async def test_bad_query_parameters_get_a_400_naming_them(backend: Backend) -> None:
    app = backend.app()
    async with client(create_app(app)) as c:
        r = await c.get("/delayed", params={"start": "-1"})
        assert r.status_code == 400 and "start must be" in r.text
        r = await c.get("/dlq", params={"after": "x<y"})
        assert r.status_code == 400 and "after must be" in r.text and "x<y" not in r.text
        assert (await c.get("/dlq/entry/nope")).status_code == 400
        assert (await c.get("/dlq/entry/1-0")).status_code == 404


async def test_a_big_payload_is_cut_with_a_size_note(backend: Backend) -> None:
    app = backend.app()

    @app.task(name="fail", max_retries=0)
    async def fail(data: Order) -> None:
        raise RuntimeError("no")

    [job_id] = [str(e) for e in await app.enqueue(fail, [Order(name="x" * 20_000)])]
    async with running(app.worker(concurrency=1)):
        await eventually(lambda: _state_is(app, job_id, "dead"), 20, "the job dead")
    async with client(create_app(app)) as c:
        page = await c.get(f"/jobs/{job_id}")
    assert re.search(r"payload cut at 4096 characters: 19\.\d KiB in all", page.text)
    assert "x" * 20_000 not in page.text


async def _state_is(app: aqw.App, job_id: str, state: str) -> bool:
    info = await app.job(job_id)
    return info is not None and info.state == state


# -- actions -----------------------------------------------------------------------------------


async def test_cancel_asks_first_then_stops_the_running_job(backend: Backend) -> None:
    async with scene(backend) as s, client(create_app(s.app)) as c:
        ask = await c.post("/actions/cancel", data={"job_id": s.run_id})
        assert ask.status_code == 200 and "Cancel job" in ask.text and 'value="yes"' in ask.text
        assert await _state_is(s.app, s.run_id, "running")
        done = await c.post("/actions/cancel", data={"job_id": s.run_id, "confirm": "yes"})
        assert done.status_code == 200 and "cancelling" in done.text
        await eventually(lambda: _state_is(s.app, s.run_id, "cancelled"), 20, "cancelled")


async def test_replay_one_a_group_and_all(backend: Backend) -> None:
    app = backend.app()

    @app.task(name="fail", max_retries=0)
    async def fail(data: Order) -> None:
        raise RuntimeError("no")

    await app.enqueue(fail, [Order(name=str(i)) for i in range(5)])
    async with running(app.worker(concurrency=5)):
        await eventually(lambda: _dead(app, 5), 20, "5 dead jobs")
    async with client(create_app(app)) as c:
        ids = entry_ids((await c.get("/dlq")).text)
        assert len(ids) == 5
        asked = await c.post("/actions/replay", data={"ids": ids[0]})
        assert "Replay 1 dead job?" in asked.text and await _dead(app, 5)
        one = await c.post("/actions/replay", data={"ids": ids[0], "confirm": "yes"})
        assert "replayed 1 of 1" in one.text and await _dead(app, 4)
        group = await c.post("/actions/replay", data={"ids": ids[1:3], "confirm": "yes"})
        assert "replayed 2 of 2" in group.text and await _dead(app, 2)
        every = await c.post("/actions/replay", data={"all": "1", "confirm": "yes"})
        assert "replayed 2 of 2" in every.text and await _dead(app, 0)
    back = await app.broker.depth()  # on the queue again (a stopped worker's read may hold one)
    assert back.waiting + back.in_flight == 5


async def test_purge_one_and_all(backend: Backend) -> None:
    app = backend.app()

    @app.task(name="fail", max_retries=0)
    async def fail(data: Order) -> None:
        raise RuntimeError("no")

    await app.enqueue(fail, [Order(name=str(i)) for i in range(3)])
    async with running(app.worker(concurrency=3)):
        await eventually(lambda: _dead(app, 3), 20, "3 dead jobs")
    async with client(create_app(app)) as c:
        ids = entry_ids((await c.get("/dlq")).text)
        asked = await c.post("/actions/purge", data={"ids": ids[0]})
        assert "for good?" in asked.text and await _dead(app, 3)
        await c.post("/actions/purge", data={"ids": ids[0], "confirm": "yes"})
        assert await _dead(app, 2)
        gone = await c.post("/actions/purge", data={"all": "1", "confirm": "yes"})
        assert "deleted 2 entries; 0 left" in gone.text and await _dead(app, 0)
    assert (await app.broker.depth()).waiting == 0


async def _dead(app: aqw.App, n: int) -> bool:
    return (await app.broker.depth()).dead == n


async def test_replay_with_an_edited_payload_is_validated_first(backend: Backend) -> None:
    app = backend.app()
    seen: list[Order] = []

    @app.task(name="picky", max_retries=0)
    async def picky(data: Order) -> None:
        if data.qty < 1:
            raise ValueError("qty must be positive")
        seen.append(data)

    [job_id] = [str(e) for e in await app.enqueue(picky, [Order(name="a", qty=0)])]
    async with running(app.worker(concurrency=1)):
        await eventually(lambda: _dead(app, 1), 20, "the dead job")
        async with client(create_app(app)) as c:
            [entry] = entry_ids((await c.get("/dlq")).text)
            page = await c.get(f"/dlq/entry/{entry}")
            assert "&#34;qty&#34;: 0" in page.text and "Validate and replay" in page.text
            for bad, why in (('{"name": "a", "qty": "many"}', "does not fit"), ("{", "not JSON")):
                r = await c.post("/actions/replay-edited", data={"entry": entry, "payload": bad})
                assert r.status_code == 400 and why in r.text and await _dead(app, 1)
            good = '{"name": "a", "qty": 2}'
            ask = await c.post("/actions/replay-edited", data={"entry": entry, "payload": good})
            assert "edited payload?" in ask.text and await _dead(app, 1)
            form = {"entry": entry, "payload": good, "confirm": "yes"}
            done = await c.post("/actions/replay-edited", data=form)
            assert "replayed 1 entry" in done.text
            await eventually(lambda: seen, 20, "the replayed job to run")
    assert seen == [Order(name="a", qty=2)] and await _dead(app, 0)
    assert await _state_is(app, job_id, "succeeded")


# -- guards ------------------------------------------------------------------------------------


async def test_read_only_refuses_every_action_and_shows_no_buttons(backend: Backend) -> None:
    async with scene(backend) as s, client(create_app(s.app, read_only=True)) as c:
        dlq = await c.get("/dlq")
        assert "read-only" in dlq.text and "<button" not in dlq.text.split("<main>")[1]
        [entry] = re.findall(r'/dlq/entry/([0-9]+-[0-9]+)"', dlq.text)[:1]
        for path, form in (
            ("/actions/cancel", {"job_id": s.run_id, "confirm": "yes"}),
            ("/actions/replay", {"ids": entry, "confirm": "yes"}),
            ("/actions/replay", {"all": "1", "confirm": "yes"}),
            ("/actions/purge", {"all": "1", "confirm": "yes"}),
            ("/actions/replay-edited", {"entry": entry, "payload": "{}", "confirm": "yes"}),
        ):
            r = await c.post(path, data=form)
            assert r.status_code == 403 and "read-only" in r.text, path
        assert await _dead(s.app, 1) and await _state_is(s.app, s.run_id, "running")
        assert (await c.get("/actions/cancel")).status_code == 405


async def test_cross_site_posts_are_refused(backend: Backend) -> None:
    async with scene(backend) as s, client(create_app(s.app)) as c:
        form = {"job_id": s.run_id, "confirm": "yes"}
        for headers in (
            {"sec-fetch-site": "cross-site"},
            {"sec-fetch-site": "same-site"},
            {"origin": "http://evil.test"},
            {"origin": "null"},
        ):
            r = await c.post("/actions/cancel", data=form, headers=headers)
            assert r.status_code == 403 and "cross-site request refused" in r.text, headers
        assert await _state_is(s.app, s.run_id, "running")
        same = {"origin": "http://dash.test", "sec-fetch-site": "same-origin"}
        r = await c.post("/actions/cancel", data=form, headers=same)
        assert r.status_code == 200 and "cancelling" in r.text


async def test_the_auth_hook_guards_every_page(backend: Backend) -> None:
    app = backend.app()
    seen: list[str] = []

    def sync_hook(request: Any) -> bool:
        seen.append(request.url.path)
        return request.headers.get("x-user") == "ops"

    async def async_hook(request: Any) -> bool:
        return request.headers.get("x-user") == "ops"

    for hook in (sync_hook, async_hook):
        async with client(create_app(app, auth=hook)) as c:
            denied = await c.get("/")
            assert denied.status_code == 401 and "Basic" in denied.headers["www-authenticate"]
            assert (await c.post("/actions/replay", data={"all": "1"})).status_code == 401
            assert (await c.get("/", headers={"x-user": "ops"})).status_code == 200
    assert seen[:1] == ["/"]


async def test_mounted_in_fastapi_without_a_lifespan_connecting_once(backend: Backend) -> None:
    app = backend.app()
    connects = 0
    real_connect = app.broker.connect

    async def counting() -> None:
        nonlocal connects
        connects += 1
        await real_connect()

    app.broker.connect = counting  # type: ignore[method-assign]
    api = FastAPI()
    api.mount("/aqw", create_app(app))
    async with client(api) as c:
        pages = await asyncio.gather(*(c.get(p) for p in ("/aqw/", "/aqw/dlq", "/aqw/running")))
        assert [p.status_code for p in pages] == [200, 200, 200]
        assert 'href="/aqw/static/dashboard.css"' in pages[0].text
        assert 'href="/aqw/workers"' in pages[0].text
        assert (await c.get("/aqw/static/refresh.js")).status_code == 200
    assert connects == 1


def test_a_trace_url_without_its_placeholder_is_refused() -> None:
    with pytest.raises(aqw.ConfigError, match="trace_url"):
        create_app(aqw.App(), trace_url="https://tempo/trace/")


# -- depth history -----------------------------------------------------------------------------


async def test_depth_history_one_sample_per_bucket_whatever_the_workers(backend: Backend) -> None:
    one, two = backend.broker(), backend.broker()
    await one.connect()
    await two.connect()
    now = time.time() // DEPTH_BUCKET * DEPTH_BUCKET
    await one.schedule([aqw.Job(task="t")], time.time() + 600)
    await one.history.sample(now + 1)
    await one.schedule([aqw.Job(task="t")], time.time() + 600)  # the depth moves on, but
    for broker in (two, one):  # the bucket has its sample: these add none
        await broker.history.sample(now + 2)
    await two.history.sample(now + DEPTH_BUCKET)
    reader = backend.broker()  # another process reads it too
    history = await reader.history.since(now - 1)
    await reader.close()
    assert [(s.at, s.delayed) for s in history] == [(now, 1), (now + DEPTH_BUCKET, 2)]
    await one.history.sample(now + DEPTH_KEEP + 2 * DEPTH_BUCKET)  # trims what is past the window
    assert [s.at for s in await two.history.since(0)] == [now + DEPTH_KEEP + 2 * DEPTH_BUCKET]
    await one.close()
    await two.close()


async def test_a_depth_sample_counts_every_priority_level(backend: Backend) -> None:
    broker = backend.broker()
    await broker.connect()
    await broker.publish([aqw.Job(task="t"), aqw.Job(task="t", priority=5)])
    await broker.schedule([aqw.Job(task="t", priority=9)], time.time() + 600)
    now = time.time() // DEPTH_BUCKET * DEPTH_BUCKET
    await broker.history.sample(now + 1)
    [sample] = await broker.history.since(now - 1)
    assert (sample.waiting, sample.delayed) == (2, 1)
    await broker.close()


async def test_the_delayed_page_merges_every_priority_level(backend: Backend) -> None:
    broker = backend.broker()
    await broker.connect()
    now = time.time()
    jobs = [aqw.Job(task="t", payload=i, priority=p) for i, p in enumerate((0, 5, 9, 0, 5))]
    for i, job in enumerate(jobs):
        await broker.schedule([job], now + 600 - 60 * i)  # the last one due first
    page = await broker.history.delayed_page(0, 3)
    assert [aqw.Job.decode(d.data).id for d in page] == [j.id for j in jobs[::-1][:3]]
    rest = await broker.history.delayed_page(3, 50)
    assert [aqw.Job.decode(d.data).id for d in rest] == [j.id for j in jobs[1::-1]]
    await broker.close()


async def test_workers_write_depth_samples_with_their_heartbeat(backend: Backend) -> None:
    app = backend.app()

    @app.task(name="noop")
    async def noop() -> None:
        return None

    async with running(app.worker(concurrency=1, heartbeat=0.05)):
        await eventually(lambda: app.broker.history.since(0), 10, "a depth sample")
        async with client(create_app(app)) as c:
            page = await c.get("/")
    assert 'data-series="waiting"' in page.text and "no depth samples yet" not in page.text


# -- bounded cost ------------------------------------------------------------------------------

#: Most Redis commands each page may send (docs/dashboard.md states the same bounds).
BOUNDS = {
    "/": 20,
    "/workers": 3,
    "/running": 8 + PAGE,
    "/delayed": 8,
    "/schedules": 4,
    "/dlq": 8,
    "/redis": 1,
    "/jobs/some-job": 3,
}


def _commands(client: redis.Redis) -> dict[str, int]:
    """Calls per command so far (this INFO call itself counted in the next reading)."""
    stats: Any = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def _sent(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The commands sent between two readings, less the first reading's INFO."""
    out = {k: n - before.get(k, 0) for k, n in after.items()}
    out["info"] = out.get("info", 0) - 1
    return {k: n for k, n in out.items() if n}


async def _fill(url: str, queue: str, n: int) -> aqw.App:
    app = aqw.App(url, queue=queue)
    await app.broker.connect()
    assert isinstance(app.broker, RedisBroker)
    raw = redis.Redis.from_url(url)
    keys = app.broker.keys
    job = aqw.Job(task="t", payload={"n": 1}).encode()
    # Written by the server itself, 10,000 of each a call: sent from here, 300,000 commands
    # cost this process about 5 s of CPU.
    fill = raw.register_script(_FILL)
    for start in range(0, n, 10_000):
        count = min(n, start + 10_000) - start
        due = time.time() + 3600
        fill(keys=[keys.stream, keys.delayed, keys.dlq], args=[job, start, count, due])
    raw.close()
    return app


#: n entries in the stream, the delayed set (members the job plus their number) and the DLQ.
_FILL = """
local job, first, count, due = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
for i = first, first + count - 1 do
  redis.call('XADD', KEYS[1], '*', 'j', job)
  redis.call('ZADD', KEYS[2], due, job .. tostring(i))
  redis.call('XADD', KEYS[3], '*', 'j', job, 'task', 't', 'error_type', 'E', 'error', 'e')
end
return count
"""


@pytest.mark.redis
async def test_every_page_costs_a_bounded_number_of_commands(private_redis: PrivateRedis) -> None:
    raw = redis.Redis.from_url(private_redis.url)
    counts: dict[int, dict[str, int]] = {}
    for n in (10, 100_000):
        app = await _fill(private_redis.url, f"size-{n}", n)
        assert (await app.broker.depth()).dead == n
        async with client(create_app(app)) as c:
            await c.get("/")  # connects
            counts[n] = {}
            first = await app.broker.dlq_list(1)
            bounds = {**BOUNDS, f"/dlq/entry/{first[0].id}": 1}
            for path in bounds:
                before = _commands(raw)
                assert (await c.get(path)).status_code in (200, 404)
                sent = _sent(before, _commands(raw))
                counts[n][path] = sum(sent.values())
        await app.close()
    raw.close()
    for n in counts:
        counts[n] = {re.sub(r"/dlq/entry/.*", "/dlq/entry", p): c for p, c in counts[n].items()}
    for path, bound in {**BOUNDS, "/dlq/entry": 1}.items():
        assert counts[10][path] == counts[100_000][path] <= bound, (path, counts)


@pytest.mark.redis
async def test_an_evicting_redis_is_flagged(private_redis: PrivateRedis) -> None:
    raw = redis.Redis.from_url(private_redis.url)
    raw.config_set("maxmemory-policy", "allkeys-lru")
    raw.close()
    app = aqw.App(private_redis.url, queue="q")
    async with client(create_app(app)) as c:
        page = await c.get("/redis")
    await app.close()
    assert 'id="eviction-warning"' in page.text and "allkeys-lru" in page.text


# -- the command -------------------------------------------------------------------------------


@pytest.mark.redis
def test_aqw_dashboard_serves_on_loopback(tmp_path: Any, queue_name: str) -> None:
    (tmp_path / "dash_app.py").write_text(
        f"import aqw\napp = aqw.App({REDIS_URL!r}, queue={queue_name!r})\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aqw",
            "dashboard",
            "--app",
            "dash_app:app",
            "--port",
            str(port),
            "--read-only",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/dlq", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "aqw dashboard did not answer"
                time.sleep(0.1)
        assert r.status_code == 200 and "read-only" in r.text
        refused = httpx.post(f"http://127.0.0.1:{port}/actions/purge", data={"all": "1"})
        assert refused.status_code == 403
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_aqw_dashboard_binds_to_loopback_unless_told() -> None:
    from aqw.cli._main import build_parser

    args = build_parser().parse_args(["dashboard", "--app", "m:app"])
    assert (args.host, args.port, args.read_only) == ("127.0.0.1", 8080, False)
