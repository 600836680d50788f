"""``aqw queue pause|resume|status|promote|delete``, in-process (``run_command``) against the
in-process broker and the real Redis, and once by subprocess against the real Redis."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import aqw
from aqw.cli._main import run_command
from tests._helpers import REDIS_URL
from tests.conftest import Backend, open_backend

pytestmark = pytest.mark.timeout(60)

KINDS = ["memory", pytest.param("redis", marks=pytest.mark.redis)]


@pytest.fixture(params=KINDS)
async def kit(request: pytest.FixtureRequest, queue_name: str):  # type: ignore[no-untyped-def]
    async with open_backend(request.param, queue_name) as backend:
        yield backend


def target(backend: Backend) -> list[str]:
    url = "memory://" if backend.kind == "memory" else REDIS_URL
    return ["--broker", url, "--queue", backend.queue]


async def test_pause_resume_status(kit: Backend, capsys: pytest.CaptureFixture[str]) -> None:
    app = kit.app()
    await app.broker.publish([aqw.Job(task="work", payload={"n": 1})])
    await app.broker.publish([aqw.Job(task="work", payload={"n": 2}, priority=3)])
    assert await run_command(["queue", "status", *target(kit)]) == 0
    out = capsys.readouterr().out
    assert f"queue {kit.queue}: running" in out
    assert "2 waiting (priority 3: 1, priority 0: 1)" in out
    assert await run_command(["queue", "pause", kit.queue, *target(kit)[:2]]) == 0
    assert capsys.readouterr().out.strip() == f"queue {kit.queue}: paused"
    assert app.broker.control is not None and await app.broker.control.paused()
    assert await run_command(["queue", "pause", *target(kit)]) == 0
    assert "(it was paused already)" in capsys.readouterr().out
    assert await run_command(["queue", "status", *target(kit)]) == 0
    assert "paused (workers fetch nothing)" in capsys.readouterr().out
    assert await run_command(["queue", "resume", *target(kit)]) == 0
    assert capsys.readouterr().out.strip() == f"queue {kit.queue}: resumed"
    assert not await app.broker.control.paused()


async def test_promote_and_delete(kit: Backend, capsys: pytest.CaptureFixture[str]) -> None:
    app = kit.app()
    later = aqw.Job(task="work", payload={"n": 1})
    await app.broker.schedule([later], run_at=9_999_999_999)
    waiting = aqw.Job(task="work", payload={"n": 2})
    await app.broker.publish([waiting])
    assert await run_command(["queue", "promote", "nope", *target(kit)]) == 1
    assert "no delayed job has this id" in capsys.readouterr().err
    assert await run_command(["queue", "promote", later.id, *target(kit)]) == 0
    assert "due now" in capsys.readouterr().out
    await app.broker.promote_due()
    assert (await app.broker.depth()).waiting == 2
    assert await run_command(["queue", "delete", waiting.id, *target(kit)]) == 0
    assert capsys.readouterr().out.strip() == f"job {waiting.id}: deleted"
    depth = await app.broker.depth()
    assert (depth.waiting, depth.delayed) == (1, 0)
    assert await run_command(["queue", "delete", waiting.id, *target(kit)]) == 1
    assert "not among the first" in capsys.readouterr().err


@pytest.mark.redis
def test_queue_pause_by_subprocess(queue_name: str) -> None:
    env = {**os.environ, "AQW_BROKER": REDIS_URL}
    env.pop("AQW_APP", None)

    def aqw_cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "aqw", "queue", *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )

    paused = aqw_cli("pause", queue_name)
    assert (paused.returncode, paused.stdout) == (0, f"queue {queue_name}: paused\n")
    shown = aqw_cli("status", queue_name)
    assert shown.returncode == 0 and "paused" in shown.stdout
    resumed = aqw_cli("resume", queue_name)
    assert (resumed.returncode, resumed.stdout) == (0, f"queue {queue_name}: resumed\n")
