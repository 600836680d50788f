"""Limits changed at run time on the PostgreSQL broker (``aqw_limits``), against the real
PostgreSQL: ``aqw limits set|show|reset`` from the command line, seen by another app's
broker; a running worker honours a raised cap without a restart."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

import aqw
from tests._helpers import PG_DSNS, eventually, running

pytestmark = pytest.mark.timeout(120)

APP_MODULE = """
import aqw
app = aqw.App("{url}")

@app.task(name="send", rate_limit="20/s", concurrency_key=lambda p: p, max_per_key=2)
async def send(p: str) -> None: ...
"""


@pytest.fixture
async def url() -> AsyncIterator[str]:
    dsn, schema = PG_DSNS[0], f"aqw_pgl_{uuid.uuid4().hex[:10]}"
    yield f"{dsn}?schema={schema}&queue=q"
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(tmp_path), *sys.path])
    return subprocess.run(
        [sys.executable, "-m", "aqw", "limits", *args],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_set_show_reset_from_the_command_line(url: str, tmp_path: Path) -> None:
    (tmp_path / "pg_limits_app.py").write_text(APP_MODULE.format(url=url))
    target = ["--app", "pg_limits_app:app"]
    out = await asyncio.to_thread(_cli, tmp_path, "set", *target, "send", "5/s")
    assert out.returncode == 0, out.stderr
    assert "send  rate 5/s (registered 20/s)" in out.stdout
    out = await asyncio.to_thread(_cli, tmp_path, "set", *target, "send", "--max-per-key", "4")
    assert out.returncode == 0, out.stderr

    other = aqw.App(url)  # another app's broker reads the same rows

    @other.task(name="send", rate_limit="20/s", concurrency_key=lambda p: p, max_per_key=2)
    async def send(p: str) -> None: ...

    assert await other.broker.run_limits.read() == {"rate:send": "5/s", "cap:send": "4"}  # type: ignore[union-attr]
    assert [r["now"] for r in await other.limits.show()] == ["5/s", "4"]

    out = await asyncio.to_thread(_cli, tmp_path, "reset", *target, "send")
    assert out.returncode == 0, out.stderr
    out = await asyncio.to_thread(_cli, tmp_path, "show", *target, "--json")
    assert out.returncode == 0, out.stderr
    assert [(r["kind"], r["now"]) for r in json.loads(out.stdout)] == [
        ("rate", "20/s"),
        ("max_per_key", "2"),
    ]
    assert await other.broker.run_limits.read() == {}  # type: ignore[union-attr]
    await other.close()


async def test_a_running_worker_honours_a_raised_cap_without_restart(url: str) -> None:
    app = aqw.App(url)
    running_now: list[int] = []
    most = [0]
    release = asyncio.Event()

    @app.task(name="capped", concurrency_key=lambda p: "one", max_per_key=1)
    async def capped(n: int) -> None:
        running_now.append(n)
        most[0] = max(most[0], len(running_now))
        await release.wait()
        running_now.remove(n)

    await capped.enqueue_many(list(range(6)))
    async with running(app.worker(concurrency=6)) as worker:
        await eventually(lambda: len(running_now) == 1, 30, "one job of the key running")
        await eventually(lambda: worker.stats.deferred >= 2, 30, "others put off by the cap")
        assert most[0] == 1
        await app.limits.set("capped", max_per_key=3)
        await eventually(lambda: len(running_now) == 3, 30, "three of the key at once")
        release.set()
        await eventually(lambda: not running_now and most[0] == 3, 30, "the rest")
    assert most[0] == 3
    await app.close()
