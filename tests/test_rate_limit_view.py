"""The rate limits in force, where operators look (issue 28 item 2): ``aqw status`` (text and
``--json``'s ``rate_limits``) and the ``aqw.task.rate_limit`` gauge show each task's rate
limit now, an ``aqw.Adaptive`` one's current value included (stored with the queue as a limit
changed at run time, as a handler's ``RateLimited`` lowers it)."""

from __future__ import annotations

import pytest
from conftest import Backend

import aqw
from aqw.status import gather_status, render
from tests._helpers import eventually, running
from tests.test_telemetry import Otel, base_attrs, otel  # noqa: F401 - the fixture, by name

pytestmark = pytest.mark.timeout(60)


def register(app: aqw.App) -> None:
    async def h(n: int) -> None:
        return None

    app.task(name="call", rate_limit=aqw.Adaptive("100/s", min="10/s"))(h)
    app.task(name="fixed", rate_limit="20/s")(h)
    app.task(name="plain")(h)


async def test_status_shows_the_adaptive_limit_now(backend: Backend) -> None:
    app = backend.app()
    register(app)
    store = app.broker.run_limits
    assert store is not None
    await store.write("rate:call", "25/s")  # what two 429s leave (100 -> 50 -> 25)
    await app.limits.set("fixed", "5/s")
    status = await gather_status(app)
    assert status["rate_limits"] == [
        {"task": "call", "registered": "100/s", "now": "25/s"}
        | {"per_second": 25.0, "adaptive": True, "min": "10/s"},
        {"task": "fixed", "registered": "20/s", "now": "5/s"}
        | {"per_second": 5.0, "adaptive": False, "min": None},
    ]
    text = render(status)
    lines = text[text.index("rate limits:") :].splitlines()
    assert lines[1].split() == ["TASK", "NOW", "REGISTERED", "ADAPTIVE", "MIN"]
    assert lines[2].split() == ["call", "25/s", "100/s", "10/s"]
    assert lines[3].split() == ["fixed", "5/s", "20/s", "-"]
    await app.limits.reset("call")
    assert (await gather_status(app))["rate_limits"][0]["now"] == "100/s"


async def test_no_rate_limit_no_section(backend: Backend) -> None:
    app = backend.app()

    @app.task(name="plain")
    async def plain(n: int) -> None: ...

    status = await gather_status(app)
    assert status["rate_limits"] == []
    assert "rate limits:" not in render(status)


async def test_the_worker_exports_the_rate_limit_gauge(backend: Backend, otel: Otel) -> None:  # noqa: F811
    app = backend.app(**otel.providers())
    register(app)
    store = app.broker.run_limits
    assert store is not None
    base = base_attrs(backend)

    def gauge() -> dict[str, float]:
        points = otel.metrics().get("aqw.task.rate_limit", [])
        return {a["aqw.task"]: p.value for a, p in points if a.items() >= base.items()}

    async with running(app.worker(concurrency=1, heartbeat=0.1)):
        await eventually(lambda: gauge() == {"call": 100.0, "fixed": 20.0}, 10, "the registered")
        await store.write("rate:call", "12/s")  # as an upstream's 429s lower it
        await eventually(lambda: gauge() == {"call": 12.0, "fixed": 20.0}, 10, "the lowered")
