"""A forged job lease key (someone with write access to Redis) is reported, and cleared only
on request.

Crash recovery takes a job over only once its lease key is gone; a key with no expiry that no
worker holds blocks its job for ever. What must hold:

- the job is named by ``blocked_leases`` once its delivery has been untouched for longer
  than ``blocked_after`` its lease TTL, not before, and a job a live worker runs (its record
  running, its lease expiry ahead) never is;
- ``aqw status`` (text and ``--json``) and the dashboard's running page say which job, for
  how long, and the ``aqw job release`` to run; what the key holds never reaches a screen raw;
- ``aqw job release`` deletes that key (compare-and-delete of the token it read), refuses
  while a live worker holds the lease (exit 1, the key kept), says so when there is no key,
  and the job then runs; nothing is cleared without it. On the memory broker (leases in the
  worker process) there is nothing to release.

Library checks run on fakeredis and the real Redis; the CLI as ``python -m aqw`` on the real
Redis, as in tests/test_damaged_state.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import REDIS_URL, Backend

import aqw
from aqw.brokers.base import Delivery
from aqw.brokers.memory import MemoryBroker
from aqw.brokers.messages import BlockedLease, Release
from aqw.brokers.redis import RedisBroker
from aqw.brokers.redis import _blocked as blocked_module
from aqw.brokers.redis._blocked import blocked_after
from aqw.dashboard import create_app
from aqw.errors import LeaseUnavailable
from aqw.job import Job
from aqw.lease import Lease
from aqw.status import gather_status, render
from tests._cli_runs import run_aqw
from tests._helpers import eventually

pytestmark = pytest.mark.timeout(60)


async def blocked_leases(
    broker: aqw.Broker, ttl_of: Callable[[Job | None], float]
) -> list[BlockedLease]:
    """What ``aqw status`` reads: the jobs the queue's server part names as blocked."""
    return [] if broker.server is None else await broker.server.blocked_leases(ttl_of)


async def release_lease(broker: aqw.Broker, job_id: str) -> Release:
    """What ``aqw job release`` does through the server part."""
    if broker.server is None:
        return Release("unsupported")
    return await broker.server.release_lease(job_id)


def lease_ttl_of(app: aqw.App | None) -> Callable[[Job | None], float]:
    return app.lease_ttl_of if app is not None else (lambda job: 30.0)


TTL = 0.4
FORGED = b"forged\x1b[2J"


class Scene:
    """A queue of two jobs, both delivered to consumer ``w1``: ``blocked`` behind a forged
    lease key (its start refused, as a worker's would be), ``live`` under a live lease."""

    def __init__(self, backend: Backend) -> None:
        self.app = backend.app(lease_ttl=TTL)
        self.raw = backend.raw
        self.ran: list[int] = []

        @self.app.task(name="t")
        async def t(n: int) -> None:
            self.ran.append(n)

        self.task = t

    async def set_up(self) -> None:
        assert self.raw is not None
        broker = self.broker
        self.blocked = str(await self.task.enqueue(1))
        self.live = str(await self.task.enqueue(2))
        await self.raw.set(broker.keys.lease(self.blocked), FORGED)  # no expiry
        await broker.start_consuming("w1")
        got: list[Delivery] = []
        while len(got) < 2:
            got += await broker.fetch(2, block=0.1)
        by_id = {aqw.Job.decode(d.data).id: d for d in got}
        self.live_lease = self.lease(self.live, by_id[self.live], ttl=30)
        await self.live_lease.acquire()
        with pytest.raises(LeaseUnavailable):
            await self.lease(self.blocked, by_id[self.blocked], ttl=TTL).acquire()

    @property
    def broker(self) -> RedisBroker:
        broker = self.app.broker
        assert isinstance(broker, RedisBroker)
        return broker

    def lease(self, job_id: str, d: Delivery, ttl: float) -> Lease:
        job = aqw.Job.decode(d.data)
        assert job.id == job_id
        backend = self.broker.job_lease_backend(job, delivery=d)
        return Lease(backend, self.broker.job_lease_key(job), ttl=ttl)

    async def until_blocked(self) -> None:
        await asyncio.sleep(blocked_after(TTL) + 0.3)


async def test_a_forged_lease_key_is_named_then_released_on_request(
    redis_backend: Backend,
) -> None:
    s = Scene(redis_backend)
    await s.set_up()
    broker, raw = s.broker, s.raw
    assert raw is not None
    ttl_of = lease_ttl_of(s.app)
    assert await blocked_leases(broker, ttl_of) == []  # not yet: recovery may still take it
    await s.until_blocked()
    [blocked] = await blocked_leases(broker, ttl_of)
    assert (blocked.job_id, blocked.token) == (s.blocked, FORGED)
    assert blocked.held_for >= blocked_after(TTL)

    status = await gather_status(s.app, "--app pkg.jobs:app")
    [line] = [p for p in status["problems"] if p.startswith(f"job {s.blocked}: ")]
    assert "lease key held by an unknown token for " in line
    assert line.endswith(f"clear it with `aqw job release --app pkg.jobs:app {s.blocked}`")
    assert [(b["job_id"], b["token"]) for b in status["blocked"]] == [(s.blocked, FORGED.decode())]
    assert "\x1b" not in render(status)

    held = await release_lease(broker, s.live)  # a live worker holds it: refused
    assert (held.outcome, held.worker) == ("held", "w1") and held.expires_in > 20
    assert await raw.get(broker.keys.lease(s.live)) == s.live_lease.token.encode()

    done = await release_lease(broker, s.blocked)
    assert (done.outcome, done.token) == ("released", FORGED)
    assert await raw.get(broker.keys.lease(s.blocked)) is None
    assert (await release_lease(broker, s.blocked)).outcome == "no lease"
    assert await blocked_leases(broker, ttl_of) == []

    assert await s.live_lease.release()  # its worker "died": recovery takes both over
    async with s.app.worker(concurrency=2):
        await eventually(lambda: sorted(s.ran) == [1, 2], 20, "both jobs to run")


async def test_a_forged_key_is_kept_until_released(redis_backend: Backend) -> None:
    """Workers running meanwhile never clear it: the job stays blocked, reported."""
    s = Scene(redis_backend)
    await s.set_up()
    assert s.raw is not None
    async with s.app.worker(concurrency=2):
        await s.until_blocked()
    assert await s.raw.get(s.broker.keys.lease(s.blocked)) == FORGED
    assert s.ran == []
    assert [b.job_id for b in await blocked_leases(s.broker, lease_ttl_of(s.app))] == [s.blocked]


async def test_token_changed_meanwhile_is_not_released(
    redis_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = Scene(redis_backend)
    await s.set_up()
    assert s.raw is not None
    raw, key = s.raw, s.broker.keys.lease(s.blocked)
    real = blocked_module.scripts.load

    def swapped(name: str) -> Any:  # another holder takes the key between the read and the delete
        script = real(name)

        async def later(*args: Any) -> Any:
            await raw.set(key, b"someone else")
            return await script(*args)

        return later

    monkeypatch.setattr(blocked_module.scripts, "load", swapped)
    assert (await release_lease(s.broker, s.blocked)).outcome == "changed"
    assert await raw.get(key) == b"someone else"


async def test_the_memory_broker_has_nothing_to_release() -> None:
    broker = MemoryBroker("forged-mem")
    assert (await release_lease(broker, "any")).outcome == "unsupported"
    assert await blocked_leases(broker, lease_ttl_of(None)) == []


async def test_the_dashboard_running_page_names_the_blocked_job(redis_backend: Backend) -> None:
    s = Scene(redis_backend)
    await s.set_up()
    await s.until_blocked()
    web = create_app(s.app)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=web), base_url="http://dash.test"
    ) as c:
        page = (await c.get("/running")).text
        overview = (await c.get("/")).text
    assert 'id="blocked"' in page and s.blocked in page
    assert f"aqw job release --app ... {s.blocked}" in page
    assert "lease key held by an unknown token" in overview  # the overview's problems
    assert "\x1b" not in page and "\x1b" not in overview


def aqw_cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[bytes]:
    return run_aqw(["--log-level", "WARNING", *argv], None, env, text=False)


APP_MODULE = """
import os
import aqw

app = aqw.App(os.environ["FORGED_REDIS"], queue=os.environ["FORGED_QUEUE"], lease_ttl={ttl})
"""


@pytest.mark.redis
@pytest.mark.parametrize("redis_backend", ["redis"], indirect=True)
async def test_aqw_status_and_aqw_job_release(
    redis_backend: Backend, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    s = Scene(redis_backend)
    (tmp_path / "forged_app.py").write_text(APP_MODULE.format(ttl=TTL))
    env = {k: v for k, v in subprocess_env.items() if not k.startswith("AQW_")}
    env.update(FORGED_REDIS=REDIS_URL, FORGED_QUEUE=s.app.queue)
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    await s.set_up()
    await s.until_blocked()
    target = ["--app", "forged_app:app"]
    status = aqw_cli(env, "status", *target)
    assert status.returncode == 0, status.stderr
    text = status.stdout.decode()
    assert f"job {s.blocked}: lease key held by an unknown token for " in text
    assert f"aqw job release --app forged_app:app {s.blocked}" in text and "\x1b" not in text
    data = json.loads(aqw_cli(env, "status", *target, "--json").stdout)
    assert [b["job_id"] for b in data["blocked"]] == [s.blocked]

    live = aqw_cli(env, "job", "release", s.live, *target)
    assert live.returncode == 1 and b"worker w1 holds its lease" in live.stderr, live.stderr
    done = aqw_cli(env, "job", "release", s.blocked, *target)
    assert done.returncode == 0, done.stderr
    assert b"released its lease key" in done.stdout and b"\x1b" not in done.stdout
    again = aqw_cli(env, "job", "release", s.blocked, *target)
    assert again.returncode == 0 and b"no lease key: nothing to release" in again.stdout
    assert redis_backend.raw is not None
    assert await redis_backend.raw.get(s.broker.keys.lease(s.blocked)) is None
