"""Due times of the delayed set in seconds on every broker (the dashboard's Delayed page
reads them)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

import aqw
from tests.conftest import BACKENDS, Backend, open_backend


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
