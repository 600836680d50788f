"""Limits changed at run time on NATS JetStream (``aqw/brokers/nats/_run_limits.py``): the
tests every broker that keeps them passes (``tests/test_run_limits.py``, the adaptive rate of
``tests/test_adaptive.py``), on this broker; ``aqw limits set|show|reset`` on a ``nats://``
app from other processes; two changes landing at once both hold (compare-and-set)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_adaptive import (  # noqa: F401 - collected here, on this broker
    test_a_burst_of_429s_halves_the_limit_and_successes_grow_it_back,
)
from tests.test_run_limits import (  # noqa: F401 - collected here, on this broker
    test_a_running_worker_honours_a_raised_cap_without_restart,
    test_set_show_reset_round_trip,
)

from .conftest import URL, broker

pytestmark = pytest.mark.timeout(120)

APP_MODULE = """
import aqw
app = aqw.App("{url}", queue="{queue}")

@app.task(name="limited", rate_limit="50/s", concurrency_key=lambda n: "k", max_per_key=2)
async def limited(n: int) -> None: ...
"""


def _limits(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{Path(__file__).parents[3]}"}
    return subprocess.run(
        [sys.executable, "-m", "aqw", "limits", *args, "--app", "limits_app:app"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_the_limits_command_on_a_nats_queue(nats_queue: str, tmp_path: Path) -> None:
    (tmp_path / "limits_app.py").write_text(APP_MODULE.format(url=URL, queue=nats_queue))
    changed = await asyncio.to_thread(_limits, tmp_path, "set", "limited", "10/s")
    assert changed.returncode == 0, changed.stderr
    assert "limited  rate 10/s (registered 50/s)" in changed.stdout
    capped = await asyncio.to_thread(_limits, tmp_path, "set", "limited", "--max-per-key", "5")
    assert capped.returncode == 0, capped.stderr
    b = broker(nats_queue)
    try:
        assert b.run_limits is not None
        assert await b.run_limits.read() == {"rate:limited": "10/s", "cap:limited": "5"}
    finally:
        await b.close()
    shown = await asyncio.to_thread(_limits, tmp_path, "show", "--json")
    assert shown.returncode == 0, shown.stderr
    assert [r["now"] for r in json.loads(shown.stdout)] == ["10/s", "5"]
    reset = await asyncio.to_thread(_limits, tmp_path, "reset", "limited")
    assert reset.returncode == 0, reset.stderr
    shown = await asyncio.to_thread(_limits, tmp_path, "show", "--json")
    assert [r["now"] for r in json.loads(shown.stdout)] == ["50/s", "2"]


async def test_changes_at_once_from_many_brokers_all_hold(nats_queue: str) -> None:
    brokers = [broker(nats_queue) for _ in range(4)]
    try:
        stores = [b.run_limits for b in brokers]
        assert all(s is not None for s in stores)
        await asyncio.gather(
            *(s.write(f"rate:t{i}", f"{i + 1}/s") for i, s in enumerate(stores) if s)
        )
        want = {f"rate:t{i}": f"{i + 1}/s" for i in range(4)}
        assert stores[0] is not None and await stores[0].read() == want
        await asyncio.gather(*(s.write(f"rate:t{i}", None) for i, s in enumerate(stores) if s))
        assert await stores[0].read() == {}
    finally:
        for b in brokers:
            await b.close()
