"""The pytest plugin ``aqw.testing.pytest`` as a user enables it (``pytest_plugins`` in a
conftest, the app named in the ini file), in a pytest of its own, under pytest-asyncio and
under anyio's plugin: a fresh memory broker per test, ``run_until_idle``, eager mode."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.testkit._subpytest import ANYIO, ASYNCIO, run_pytest

pytestmark = pytest.mark.timeout(180)

JOBS = """
import aqw

app = aqw.App("redis://127.0.0.1:1/0", queue="orders", retry=aqw.RetryPolicy(max_retries=0))
charged = []


@app.task(keep_result=True)
async def charge(cents: int) -> int:
    if cents <= 0:
        raise ValueError(f"cannot charge {cents} cents")
    charged.append(cents)
    return cents
"""

TESTS = """
import pytest

import aqw
from aqw.testing import run_until_idle

from jobs import app, charge


@pytest.mark.parametrize("cents", [100, 200])  # the second one must see a fresh queue
{mark}async def test_fresh_queue_per_test(aqw_app, cents):
    assert aqw_app is app and app.broker.in_process
    assert (await app.broker.depth()).waiting == 0
    await charge.enqueue(cents)
    await charge.enqueue(-cents)
    done = await run_until_idle(aqw_app)
    assert done.states == {{"succeeded": 1, "dead": 1}}
    assert [d.error_type for d in await app.dlq.list()] == ["ValueError"]


{mark}async def test_left_queued_for_the_next_test(aqw_app):
    await charge.enqueue(1)


{mark}async def test_eager(aqw_eager):
    job = await charge.enqueue(300)
    assert (await aqw_eager.job(job)).state == "succeeded"
    assert await aqw_eager.result(job, timeout=1) == 300
    with pytest.raises(ValueError):
        await charge.enqueue("three hundred")


{mark}async def test_any_app_on_memory(aqw_memory):
    other = aqw_memory(aqw.App("redis://127.0.0.1:1/0", queue="other"))
    assert other.broker.in_process


def test_back_on_its_broker_after_the_tests():
    assert app.broker.system == "redis"
"""

CONFTEST = 'pytest_plugins = ["aqw.testing.pytest"]\n'
CASES = {"asyncio": ("", ASYNCIO), "anyio": ("@pytest.mark.anyio\n", ANYIO)}


@pytest.mark.parametrize("plugin", sorted(CASES))
def test_plugin_fixtures(plugin: str, tmp_path: Path) -> None:
    mark, args = CASES[plugin]
    files = {
        "conftest.py": CONFTEST,
        "jobs.py": textwrap.dedent(JOBS),
        "test_app.py": textwrap.dedent(TESTS).format(mark=mark),
    }
    done = run_pytest(tmp_path, files, args, ini="aqw_app = jobs:app\n")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "6 passed" in done.stdout, done.stdout[-2000:]


def test_aqw_app_without_its_ini_option_says_what_to_set(tmp_path: Path) -> None:
    files = {
        "conftest.py": CONFTEST,
        "test_app.py": "async def test_it(aqw_app):\n    pass\n",
    }
    done = run_pytest(tmp_path, files, ASYNCIO)
    assert done.returncode != 0
    assert "aqw_app = 'module:app'" in done.stdout, done.stdout[-2000:]
