"""The adaptive rate limit (issue 28): ``rate_limit=aqw.Adaptive("100/s", min="10/s")`` is
halved by each ``aqw.RateLimited`` a handler raises (an upstream's 429), down to its
``min``, and grows back by 5% of its rate per success, up to its rate; stored with the
queue, so every worker shares it. One change a second per worker in production; here
``CHANGE_EVERY`` is 0 so that the sequence is counted, not timed."""

from __future__ import annotations

import pytest
from conftest import Backend

import aqw
from aqw.worker import _deferring
from tests._helpers import run_burst

pytestmark = pytest.mark.timeout(60)


async def test_a_burst_of_429s_halves_the_limit_and_successes_grow_it_back(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_deferring, "CHANGE_EVERY", 0.0)
    app = backend.app()
    limits: list[str | None] = []

    @app.task(name="call", rate_limit=aqw.Adaptive("100/s", min="10/s"))
    async def call(n: int) -> None:
        store = app.broker.run_limits
        assert store is not None
        limits.append(store.current().get("rate:call"))
        if len(limits) <= 4:  # the upstream answers the first four calls with a 429
            raise aqw.RateLimited(0.01)

    await call.enqueue_many(list(range(20)))
    worker = await run_burst(app, concurrency=1, within=40)
    assert worker.stats.processed == 20 and worker.stats.deferred >= 4
    # four 429s: 100 -> 50 -> 25 -> 12 -> 10 (the floor), then +5/s per success
    assert limits[:5] == [None, "50/s", "25/s", "12/s", "10/s"]
    grown = limits[5:9]
    assert grown == ["15/s", "20/s", "25/s", "30/s"]
    rows = await app.limits.show()
    assert rows == [{"name": "call", "kind": "rate", "registered": "100/s", "now": "100/s"}]


def test_adaptive_options_are_checked() -> None:
    app = aqw.App("memory://")

    async def h(n: int) -> None: ...

    with pytest.raises(aqw.ConfigError, match="Adaptive's min is above its rate"):
        app.task(name="a", rate_limit=aqw.Adaptive("5/s", min="10/s"))(h)
    with pytest.raises(aqw.ConfigError, match="rate_limit must be"):
        app.task(name="b", rate_limit=aqw.Adaptive("5/s", min="fast"))(h)
    with pytest.raises(aqw.ConfigError, match="task-wide: no rate_key"):
        app.task(name="c", rate_limit=aqw.Adaptive("5/s", min="1/s"), rate_key=lambda p: p)(h)
