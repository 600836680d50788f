"""The dashboard's hardening and its behaviour when things go wrong: security headers on
every response, the auth hook on the assets too, the Origin check by scheme, host and port,
due times in seconds on every broker, and a broker that stops answering (a 503 page naming
it, one log line per outage, recovery by itself) on a private redis-server that the test
stops and restarts."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import redis

import aqw
from aqw.dashboard import create_app
from aqw.dashboard._format import reason, when
from tests._helpers import REDIS_HOST, REDIS_PORT, eventually
from tests._proxy import TcpProxy
from tests.conftest import BACKENDS, Backend, PrivateRedis, open_backend


def client(web: Any, base: str = "http://dash.test") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=web), base_url=base)


@pytest.fixture(params=[*BACKENDS, pytest.param("redis-partitioned", marks=pytest.mark.redis)])
async def any_backend(request: pytest.FixtureRequest, queue_name: str) -> AsyncIterator[Backend]:
    async with open_backend(request.param, queue_name) as b:
        yield b


# -- due times -----------------------------------------------------------------------------------


async def test_delayed_jobs_are_due_in_seconds_on_every_broker(any_backend: Backend) -> None:
    """``delayed_page`` gives due times in seconds since the epoch, whatever the broker keeps
    (Redis scores are milliseconds): scheduled directly, enqueued with a delay, or with
    ``at=``."""
    app = any_backend.app()

    @app.task(name="later")
    async def later(n: int) -> None:
        return None

    await app.broker.connect()
    run_at = time.time() + 600
    await app.broker.schedule([aqw.Job(task="later", payload=1)], run_at)
    before = time.time()
    await later.enqueue(2, delay=900)
    after = time.time()
    await later.enqueue(3, at=datetime.fromtimestamp(run_at + 3600, UTC))
    page = await app.broker.delayed_page(0, 10)
    assert [aqw.Job.decode(d.data).payload for d in page] == [1, 2, 3]
    assert abs(page[0].due - run_at) < 0.01
    assert before + 900 - 0.01 <= page[1].due <= after + 900 + 0.01
    assert abs(page[2].due - (run_at + 3600)) < 0.01


async def test_the_delayed_page_shows_when_each_job_is_due(any_backend: Backend) -> None:
    app = any_backend.app()

    @app.task(name="later")
    async def later(n: int) -> None:
        return None

    await later.enqueue(1, delay=3 * 3600 + 120)
    async with client(create_app(app)) as c:
        page = (await c.get("/delayed")).text
    table = page[page.index('<table id="delayed"') :]
    [due] = re.findall(r"<time [^>]*>(.*?)</time>", table)
    assert "in 3h 1m" in due or "in 3h 2m" in due, due


def test_times_are_one_short_line_with_the_whole_date_as_their_tooltip() -> None:
    now = datetime(2026, 12, 1, 14, 58, 12, tzinfo=UTC).timestamp()
    today = when(now - 5.7, now)
    assert today == (
        '<time datetime="2026-12-01T14:58:06Z" title="2026-12-01 14:58:06 UTC">'
        "14:58:06 <small>5.7s ago</small></time>"
    )
    assert ">Nov 28 14:58 <small>3d 0h ago</small>" in when(now - 3 * 86400, now)
    assert ">2025-12-01 <small>365d 0h ago</small>" in when(now - 365 * 86400, now)
    assert ">14:59:12 <small>in 1m 0s</small>" in when(now + 60, now)
    assert ">2026-12-01 14:58:06 UTC <small>" in when(now - 5.7, now, full=True)
    assert (when(None, now), when(0, now), when("x", now), when(1e300, now)) == ("-", "?", "?", "?")


def test_an_error_is_named_once() -> None:
    assert reason(ConnectionError("ConnectionError: refused")) == "ConnectionError: refused"
    assert reason(ConnectionError("refused")) == "ConnectionError: refused"
    assert reason(TimeoutError()) == "TimeoutError"


# -- headers, auth on the assets, the Origin check --------------------------------------------

PAGES = ("/", "/workers", "/running", "/delayed", "/schedules", "/dlq", "/redis", "/jobs/x")
ASSETS = ("/static/dashboard.css", "/static/refresh.js")


def assert_secure(response: httpx.Response) -> None:
    h = response.headers
    where = f"{response.request.method} {response.request.url.path} ({response.status_code})"
    assert h.get("x-frame-options") == "DENY", where
    assert h.get("x-content-type-options") == "nosniff", where
    assert h.get("referrer-policy") == "same-origin", where
    csp = h.get("content-security-policy", "")
    assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp, where
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp, where


async def test_every_response_carries_the_security_headers(queue_name: str) -> None:
    async with open_backend("memory", queue_name) as backend:
        app = backend.app()
        ops = {"x-user": "ops"}
        web = create_app(app, auth=lambda request: request.headers.get("x-user") == "ops")
        async with client(web) as c:
            served = [await c.get(path, headers=ops) for path in (*PAGES, *ASSETS)]
            assert [r.status_code for r in served] == [200] * 7 + [404] + [200] * 2
            others = [
                await c.get("/static/nope.css", headers=ops),  # 404 of the assets
                await c.get("/no/such/page", headers=ops),  # 404 of the router
                await c.get("/"),  # 401 of the auth hook
                await c.get("/static/dashboard.css"),  # 401 of an asset
                await c.post("/actions/purge", data={"all": "1"}, headers=ops),  # confirm page
                await c.post(
                    "/actions/purge", data={"all": "1"}, headers={**ops, "origin": "http://x"}
                ),  # 403
                await c.get("/delayed", params={"start": "x"}, headers=ops),  # 400
            ]
            assert [r.status_code for r in others] == [404, 404, 401, 401, 200, 403, 400]
            for response in (*served, *others):
                assert_secure(response)


async def test_the_auth_hook_guards_the_assets_too(queue_name: str) -> None:
    async with open_backend("memory", queue_name) as backend:
        seen: list[str] = []

        async def hook(request: Any) -> bool:
            seen.append(request.url.path)
            return request.headers.get("authorization") == "Basic b3BzOm9wcw=="

        async with client(create_app(backend.app(), auth=hook)) as c:
            for path in ASSETS:
                refused = await c.get(path)
                assert refused.status_code == 401, path
                assert "Basic" in refused.headers["www-authenticate"]
                assert "var(--" not in refused.text and "localStorage" not in refused.text
            good = {"authorization": "Basic b3BzOm9wcw=="}
            assert [(await c.get(p, headers=good)).status_code for p in ASSETS] == [200, 200]
        assert seen == [*ASSETS, *ASSETS]


async def test_an_origin_of_another_scheme_or_port_is_refused(queue_name: str) -> None:
    """The Origin of a POST must be the request's own: scheme, host and port (the default
    port of its scheme when it names none)."""
    async with open_backend("memory", queue_name) as backend:
        app = backend.app()
        form = {"job_id": "no-such-job", "confirm": "yes"}  # served: 404, nothing to cancel
        for base, origin, status in (
            ("http://dash.test", "https://dash.test", 403),  # another scheme
            ("https://dash.test", "http://dash.test", 403),
            ("http://dash.test", "http://dash.test:8080", 403),  # another port
            ("http://dash.test:8080", "http://dash.test", 403),
            ("http://dash.test", "http://other.test", 403),  # another host
            ("http://dash.test", "http://dash.test:x", 403),  # not an origin
            ("http://dash.test", "dash.test", 403),
            ("http://dash.test", "null", 403),
            ("http://dash.test", "http://dash.test", 404),  # its own
            ("http://dash.test", "http://DASH.test:80", 404),  # the same, spelled otherwise
            ("https://dash.test:443", "https://dash.test", 404),
            ("http://[::1]:8080", "http://[::1]:8080", 404),
        ):
            async with client(create_app(app), base=base) as c:
                r = await c.post("/actions/cancel", data=form, headers={"origin": origin})
            assert r.status_code == status, (base, origin, r.text[-300:])
            if status == 403:
                assert "cross-site request refused" in r.text


def test_a_broker_timeout_that_is_not_a_positive_number_is_refused() -> None:
    for bad in (0, -1.0, float("nan"), float("inf"), "5", True):
        with pytest.raises(aqw.ConfigError, match="broker_timeout"):
            create_app(aqw.App(), broker_timeout=bad)  # type: ignore[arg-type]


# -- the broker stops answering ---------------------------------------------------------------


def outage_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "aqw.dashboard"]


@pytest.mark.redis
async def test_a_broker_that_stops_answering_gets_a_503_page_and_one_log_line(
    private_redis: PrivateRedis, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aqw.dashboard")
    secret_url = private_redis.url.replace("redis://", "redis://:hunter2@")

    def start() -> None:  # on the same port, with a password
        private_redis.start()
        admin = redis.Redis.from_url(private_redis.url)
        admin.config_set("requirepass", "hunter2")
        admin.close()

    private_redis.kill()
    start()
    app = aqw.App(secret_url, queue=queue_name)
    where = app.broker.describe()
    assert "hunter2" not in where
    async with client(create_app(app)) as c:
        assert (await c.get("/")).status_code == 200
        for outage in (1, 2):
            private_redis.kill()
            for path in (*PAGES, "/dlq/entry/1-0"):
                page = await c.get(path)
                assert page.status_code == 503, (path, page.text[-400:])
                assert page.headers["retry-after"] == "5"
                assert_secure(page)
                assert f'<code id="broker">{where}</code>' in page.text
                [error] = re.findall(r'id="broker-error">(.*?)</p>', page.text)
                assert error.startswith("ConnectionError: ") and error.count("ConnectionError") == 1
                assert "hunter2" not in page.text and 'data-refresh="5"' in page.text
            post = await c.post("/actions/purge", data={"all": "1", "confirm": "yes"})
            assert post.status_code == 503
            lines = outage_lines(caplog)
            assert [level for level, _ in lines] == [logging.WARNING, logging.INFO] * (
                outage - 1
            ) + [logging.WARNING], lines
            assert where in lines[-1][1] and "hunter2" not in lines[-1][1]
            start()  # it answers again: the next page is served, no restart
            assert (await c.get("/")).status_code == 200
            assert (await c.get("/running")).status_code == 200
            lines = outage_lines(caplog)
            assert lines[-1][0] == logging.INFO and "answers again" in lines[-1][1], lines
            assert len(lines) == 2 * outage
    await app.close()


@pytest.mark.redis
async def test_a_broker_down_from_the_first_request_on_is_connected_when_it_answers(
    private_redis: PrivateRedis, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aqw.dashboard")
    private_redis.kill()
    app = aqw.App(private_redis.url, queue=queue_name)
    async with client(create_app(app)) as c:
        for _ in range(3):
            assert (await c.get("/dlq")).status_code == 503
        private_redis.start()
        assert (await c.get("/dlq")).status_code == 200
    await app.close()
    assert [level for level, _ in outage_lines(caplog)] == [logging.WARNING, logging.INFO]


@pytest.mark.redis
async def test_a_broker_that_does_not_answer_in_time_gets_the_503_page(
    queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A blackholed link (every byte dropped): the page waits ``broker_timeout``, not the
    client's socket timeout, then says so; the link back, the page is back."""
    caplog.set_level(logging.INFO, logger="aqw.dashboard")
    proxy = await TcpProxy(REDIS_HOST, REDIS_PORT).start()
    app = aqw.App(proxy.url, queue=queue_name)
    try:
        async with client(create_app(app, broker_timeout=0.5)) as c:
            assert (await c.get("/running")).status_code == 200
            proxy.mode = "blackhole"
            page = await c.get("/running")
            assert page.status_code == 503 and "TimeoutError: no answer within 0.5s" in page.text
            proxy.mode = "pass"
            proxy.cut()
            assert (await eventually(lambda: _served(c, "/running"), 20, "the page back")) == 200
        assert [level for level, _ in outage_lines(caplog)] == [logging.WARNING, logging.INFO]
    finally:
        await app.close()
        await proxy.aclose()


async def _served(c: httpx.AsyncClient, path: str) -> int | None:
    status = (await c.get(path)).status_code
    return status if status == 200 else None
