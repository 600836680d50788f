"""Limits changed at run time (issue 28): ``app.limits`` and ``aqw limits set|show|reset``
store a rate or a per-key cap with the queue, and running workers honour it without a
restart. Counted (starts in a window of the server's clock, jobs running at once), never
timed by the test's own clock."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Backend
from redis.asyncio import Redis

import aqw
from aqw.flow import Limits, with_overrides
from tests._helpers import REDIS_URL, eventually, require_real_redis, running

pytestmark = pytest.mark.timeout(120)


def test_overrides_replace_the_registered_rate_and_cap() -> None:
    limits = Limits("send:acme", 20_000, 0, (("task:send:acme", 2), ("debounce:k", 1)))
    assert with_overrides(limits, "send", {}) == limits
    changed = with_overrides(limits, "send", {"rate:send": "10/s", "cap:send": "5"})
    assert changed.interval_us == 100_000 and changed.caps == (
        ("task:send:acme", 5),
        ("debounce:k", 1),  # not the task's cap: untouched
    )
    one_key = {"rate:send": "10/s", "rate:send:acme": "2/s"}
    assert with_overrides(limits, "send", one_key).interval_us == 500_000  # the key's wins
    bad = with_overrides(limits, "send", {"rate:send": "fast", "cap:send": "-1"})
    assert bad == limits  # a stored value that does not parse: the registered one holds


async def test_set_show_reset_round_trip(backend: Backend) -> None:
    app = backend.app()

    @app.task(
        name="send",
        rate_limit="20/s",
        rate_key=lambda p: p,
        concurrency_key=lambda p: p,
        max_per_key=2,
    )
    async def send(p: str) -> None: ...

    @app.task(name="plain")
    async def plain() -> None: ...

    rows = await app.limits.show()
    assert rows == [
        {"name": "send", "kind": "rate", "registered": "20/s", "now": "20/s"},
        {"name": "send", "kind": "max_per_key", "registered": "2", "now": "2"},
    ]
    await app.limits.set("send", "5/s", max_per_key=4)
    await app.limits.set("send:acme", "1/min")
    rows = await app.limits.show()
    assert [r["now"] for r in rows] == ["5/s", "1/min", "4"]
    assert rows[1]["name"] == "send:acme"
    await app.limits.reset("send")
    assert [r["now"] for r in await app.limits.show()] == ["20/s", "2"]

    for call, match in [
        (app.limits.set("plain", "5/s"), "task 'plain' has no rate_limit to change"),
        (app.limits.set("plain", max_per_key=2), "task 'plain' has no per-key cap"),
        (app.limits.set("send", "5 per second"), "rate_limit must be"),
        (app.limits.set("send", max_per_key=0), "max_per_key must be an integer >= 1"),
        (app.limits.set("send"), "give a rate"),
    ]:
        with pytest.raises(aqw.ConfigError, match=match):
            await call
    with pytest.raises(aqw.UnknownTask):
        await app.limits.set("nope", "5/s")


async def test_a_running_worker_honours_a_raised_cap_without_restart(backend: Backend) -> None:
    app = backend.app()
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
    async with running(app.worker(concurrency=6)):
        await eventually(lambda: len(running_now) == 1, 20, "one job of the key running")
        await asyncio.sleep(0.3)  # the others are refused by the cap and put off meanwhile
        assert most[0] == 1
        await app.limits.set("capped", max_per_key=3)
        await eventually(lambda: len(running_now) == 3, 20, "three of the key at once")
        release.set()
        await eventually(lambda: not running_now and most[0] == 3, 20, "the rest")
    assert most[0] == 3


# -- four worker processes at 50/s, changed from the command line -----------------------------

APP_MODULE = """
import aqw
app = aqw.App("{url}", queue="{queue}")

@app.task(name="limited", rate_limit="50/s")
async def limited(n: int) -> None: ...
"""


@pytest.mark.slow
async def test_a_limit_changed_from_the_cli_holds_in_every_window_after(
    queue_name: str, tmp_path: Path
) -> None:
    """4 worker processes run ``limited`` at 50/s; ``aqw limits set limited 10/s`` from the
    command line: every 1-second window of the server's clock starting a second after the
    change holds at most 10 starts, and the jobs still all run once."""
    from tests.test_rate_limits import (
        SCRIPT,
        env_for_workers,
        ledger,
        most_in_window,
        start_times,
        start_workers,
        stop_workers,
    )

    require_real_redis()
    (tmp_path / "limits_app.py").write_text(APP_MODULE.format(url=REDIS_URL, queue=queue_name))
    client = Redis.from_url(REDIS_URL)
    app = aqw.App(REDIS_URL, queue=queue_name)

    @app.task(name="limited", rate_limit="50/s")
    async def limited(n: int) -> None: ...

    env = env_for_workers(SCRIPT.parent.parent)
    procs = await start_workers(4, queue_name, "rate", env, tmp_path)
    try:
        await limited.enqueue_many(list(range(400)))
        await eventually(lambda: _count(client, queue_name, 60), 60, "60 runs", procs=procs)
        cli_env = {**env, "PYTHONPATH": f"{tmp_path}:{env['PYTHONPATH']}"}
        out = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "-m",
                "aqw",
                "limits",
                "set",
                "--app",
                "limits_app:app",
                "limited",
                "10/s",
            ],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert "limited  rate 10/s (registered 50/s)" in out.stdout
        seconds, micros = await client.time()
        changed_at = seconds + micros / 1e6
        await eventually(
            lambda: _count_after(app, client, queue_name, changed_at + 1.0, 40),
            60,
            "40 starts after the change",
            interval=0.2,
            procs=procs,
        )
        entries = await ledger(client, queue_name)
        starts = await start_times(app, [e["id"] for e in entries])
        shown = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "aqw", "limits", "show", "--app", "limits_app:app", "--json"],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        await stop_workers(procs)
        await app.close()
        await client.aclose()
    before = [t for t in starts if t < changed_at]
    after = [t for t in starts if t >= changed_at + 1.0]
    assert most_in_window(before, 1.0) > 10  # it ran faster than the new limit before
    assert len(after) >= 40 and most_in_window(after, 1.0) <= 10, sorted(after)
    assert json.loads(shown.stdout)[0]["now"] == "10/s"


async def _count(client: Redis, queue: str, n: int) -> bool:
    return bool(await client.llen(f"aqw:{{{queue}}}:ledger") >= n)  # type: ignore[misc]


async def _count_after(app: aqw.App, client: Redis, queue: str, since: float, n: int) -> bool:
    from tests.test_rate_limits import ledger, start_times

    entries = await ledger(client, queue)
    if len(entries) < n:
        return False
    starts = await start_times(app, [e["id"] for e in entries[-n:]])
    return all(t >= since for t in starts)
