"""A pytest module for your tasks: one memory:// app per test, a burst worker, the DLQ.

Needs pytest and pytest-asyncio. Run it with ``python -m pytest examples/docs/testing_pytest.py``
(running this file as a script does the same).
"""

import subprocess
import sys
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

import aqw
from aqw.brokers.memory import delete_memory_queue


def make_app(broker: str) -> aqw.App:
    """Your application's factory: the tasks registered on an app built for a broker URL."""
    app = aqw.App(broker, retry=aqw.RetryPolicy(max_retries=0))

    @app.task(name="charge")
    async def charge(cents: int) -> None:
        if cents <= 0:
            raise ValueError(f"cannot charge {cents} cents")

    return app


@pytest_asyncio.fixture
async def app() -> AsyncIterator[aqw.App]:
    queue = f"test-{uuid.uuid4().hex[:8]}"  # apps on one memory:// queue name share it
    app = make_app(f"memory://{queue}")
    yield app
    await app.close()
    delete_memory_queue(queue)


async def run_queue(app: aqw.App) -> aqw.Worker:
    """Run every job on the queue, then return the worker (its stats)."""
    async with app.worker(burst=True) as worker:
        await worker.wait_stopped()
    return worker


@pytest.mark.asyncio
async def test_a_good_charge_is_processed(app: aqw.App) -> None:
    await app.get_task("charge").enqueue(500)
    worker = await run_queue(app)
    assert worker.stats.processed == 1
    assert await app.dlq.count() == 0


@pytest.mark.asyncio
async def test_a_bad_charge_is_dead_lettered(app: aqw.App) -> None:
    await app.get_task("charge").enqueue(-1)
    await run_queue(app)
    (dead,) = await app.dlq.list(task="charge")
    assert dead.error_type == "ValueError"
    assert "cannot charge -1 cents" in dead.error


@pytest.mark.asyncio
async def test_a_bad_payload_is_refused_at_enqueue(app: aqw.App) -> None:
    with pytest.raises(ValueError):  # pydantic.ValidationError is a ValueError
        await app.get_task("charge").enqueue("a lot")


if __name__ == "__main__":  # pytest in a process of its own, as on the command line
    command = [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider"]
    sys.exit(subprocess.run(command).returncode)
