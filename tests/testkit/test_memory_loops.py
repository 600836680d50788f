"""memory:// (and redis://) outlive event loops: a module-level app on one queue, used by
tests that each run in a new loop (pytest-asyncio's function-scoped loops, anyio's pytest
plugin), works from the second test on. Each case runs in a pytest of its own (a
subprocess), with only the plugin it is about, so the plugins do not clash and a hang is a
failure with its output, not a stuck suite.

Before the queue's wake-up was loop-free, the second test's burst worker never stopped:
the queue's ``asyncio.Event`` was bound to the first test's (closed) loop. On a real Redis,
the pool's connections were: the second test's first command failed with "Event loop is
closed", unless every test ended with ``await app.close()``; a connection opened in another
loop is now dropped when it is next taken from the pool."""

from __future__ import annotations

import os
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.testkit._subpytest import ANYIO, ASYNCIO, run_pytest

pytestmark = pytest.mark.timeout(180)

#: The issue's minimal case, and what else keeps state across tests on a queue: a result
#: waiter woken from another test's worker, a cancel, a waiter left behind when its loop
#: closed, and a delayed job promoted in a later loop.
BODY = """
import asyncio

import pytest

import aqw

app = aqw.App("{url}", queue="loops-{tag}")
seen = []


@app.task(keep_result=True)
async def hello(n: int) -> int:
    seen.append(n)
    return n * 10


@pytest.mark.parametrize("n", [1, 2, 3])
{mark}async def test_burst(n):
    await hello.enqueue(n)
    async with app.worker(burst=True) as w:
        await w.wait_stopped()
    assert seen[-1] == n


{mark}async def test_waiter_left_behind_when_its_loop_closed():
    job = await hello.enqueue(4)
    waiting = asyncio.ensure_future(app.result(job, timeout=60))
    await asyncio.sleep(0)  # registered; its loop closes with it still waiting


{mark}async def test_result_in_a_later_loop():
    job = await hello.enqueue(5)
    async with app.worker(concurrency=2):
        assert await app.result(job, timeout=30) == 50


{mark}async def test_delayed_and_cancelled_in_a_later_loop():
    late = await hello.enqueue(6, delay=0.2)
    gone = await hello.enqueue(7, delay=0.2)
    assert await app.cancel(gone) == "cancelled"
    async with app.worker(concurrency=2):
        assert await app.result(late, timeout=30) == 60
    assert 7 not in seen
"""

CASES = {"asyncio": ("", ASYNCIO), "anyio": ("@pytest.mark.anyio\n", ANYIO)}
REDIS = os.environ.get("AQW_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.mark.parametrize("broker", ["memory", "redis"])
@pytest.mark.parametrize("plugin", sorted(CASES))
def test_module_level_app_across_loops(plugin: str, broker: str, tmp_path: Path) -> None:
    mark, args = CASES[plugin]
    # a tag of its own: tmp_path's name repeats across xdist workers, which share the Redis
    tag = f"{tmp_path.name}-{uuid.uuid4().hex[:8]}"
    url = f"memory://loops-{tag}" if broker == "memory" else REDIS
    source = textwrap.dedent(BODY).format(tag=tag, mark=mark, url=url)
    done = run_pytest(tmp_path, {"test_it.py": source}, args)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "6 passed" in done.stdout, done.stdout[-2000:]
