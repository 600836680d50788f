"""The command line on a ``nats://`` queue, unchanged: ``aqw status``, ``aqw dlq list``,
``show``, ``replay`` and ``purge``, and ``aqw job show`` / ``wait`` read what the workers
wrote in JetStream, from another process."""

from __future__ import annotations

import json
import subprocess

import pytest

import aqw
from tests._cli_runs import run_aqw
from tests._helpers import run_burst

from .conftest import URL

pytestmark = pytest.mark.timeout(120)


def cli(queue: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_aqw([*args, "--broker", URL, "--queue", queue], timeout=60)


async def test_status_dlq_and_job_commands(nats_queue: str) -> None:
    app = aqw.App(f"{URL}?queue={nats_queue}")

    @app.task(name="boom", max_retries=0)
    async def boom(n: int) -> None:
        raise ValueError(f"bad {n}")

    @app.task(name="fine", keep_result=True)
    async def fine(n: int) -> int:
        return n + 1

    [dead] = await app.enqueue(boom, [1])
    [ok] = await app.enqueue(fine, [41])
    await run_burst(app, concurrency=2)
    await app.close()

    status = cli(nats_queue, "status")
    assert status.returncode == 0, status.stderr
    assert "DLQ" in status.stdout
    listed = cli(nats_queue, "dlq", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    [entry] = json.loads(listed.stdout)
    assert (entry["job_id"], entry["error_type"]) == (dead, "ValueError")
    shown = cli(nats_queue, "dlq", "show", entry["id"])
    assert shown.returncode == 0 and "bad 1" in shown.stdout, shown.stderr
    job = cli(nats_queue, "job", "show", ok)
    assert job.returncode == 0 and "succeeded" in job.stdout, job.stderr
    waited = cli(nats_queue, "job", "wait", ok)
    assert waited.returncode == 0, waited.stderr
    replayed = cli(nats_queue, "dlq", "replay", "--all")
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(cli(nats_queue, "dlq", "list", "--json").stdout) == []
    broker = aqw.App(f"{URL}?queue={nats_queue}").broker
    d = await broker.depth()
    await broker.close()
    assert (d.waiting, d.dead) == (1, 0)
    purge = cli(nats_queue, "dlq", "purge", "--all")
    assert purge.returncode == 0, purge.stderr
