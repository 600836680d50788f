"""Tests of a module-level app with aqw's pytest plugin: a fresh memory:// queue per test,
``run_until_idle`` and eager mode. The app's own broker (Redis here) is never reached.

Needs pytest and pytest-asyncio. Run it with
``python -m pytest -p aqw.testing.pytest examples/docs/testing_plugin.py`` (running this
file as a script does the same).
"""

import subprocess
import sys

import pytest

import aqw
from aqw.testing import run_until_idle

# Your application's module: a module-level app, its tasks registered at import.
app = aqw.App("redis://127.0.0.1:6379/0", queue="orders", retry=aqw.RetryPolicy(max_retries=0))


@app.task(keep_result=True)
async def charge(cents: int) -> int:
    if cents <= 0:
        raise ValueError(f"cannot charge {cents} cents")
    return cents


@app.task
async def checkout(cents: int) -> None:
    await charge.enqueue(cents)  # a job that enqueues another


@pytest.fixture
def aqw_app(aqw_memory):  # or name it in the configuration: aqw_app = "myproject.jobs:app"
    return aqw_memory(app)


@pytest.mark.asyncio
async def test_run_until_idle_says_how_each_job_ended(aqw_app: aqw.App) -> None:
    good = await charge.enqueue(500)
    bad = await charge.enqueue(-1)
    done = await run_until_idle(aqw_app)  # runs the queue dry, retries and all
    assert done.states == {"succeeded": 1, "dead": 1}
    assert done.of(good).result == 500
    assert done.of(bad).error is not None and done.of(bad).error.type == "ValueError"
    (dead,) = await aqw_app.dlq.list()
    assert dead.job_id == bad


@pytest.mark.asyncio
async def test_each_test_starts_on_an_empty_queue(aqw_app: aqw.App) -> None:
    assert (await aqw_app.broker.depth()).waiting == 0


@pytest.mark.asyncio
async def test_eager_mode_runs_the_job_inside_its_enqueue(aqw_eager: aqw.App) -> None:
    job = await charge.enqueue(300)  # validated, run, recorded: all before it returns
    assert await aqw_eager.result(job, timeout=1) == 300
    await checkout.enqueue(200)  # its charge job runs in the same enqueue, after it
    assert (await aqw_eager.broker.depth()).waiting == 0
    with pytest.raises(ValueError):  # a bad payload is refused as by a real enqueue
        await charge.enqueue("a lot")


if __name__ == "__main__":  # pytest in a process of its own, as on the command line
    command = [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider"]
    command += ["-p", "aqw.testing.pytest"]
    sys.exit(subprocess.run(command).returncode)
