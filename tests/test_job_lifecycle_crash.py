"""A worker SIGKILLed after its handler returned and before its ack: the job's record never
reads ``succeeded`` until a worker has acknowledged it (the record changes in the ack step
itself), and the job is run again and then succeeds."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from ack_kill_worker import LEASE_TTL, make_app

from tests._helpers import running

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


async def test_killed_between_the_handler_and_the_ack_never_reads_succeeded(
    redis_url: str, queue_name: str, repo_root: Path, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    app = make_app(queue_name)
    marker = tmp_path / "killed"
    try:
        job_id = await app.tasks["work"].enqueue(4)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(repo_root / "tests" / "ack_kill_worker.py"),
            queue_name,
            str(marker),
            cwd=repo_root,
            env=subprocess_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        code = await asyncio.wait_for(proc.wait(), 30)
        assert code == -9 and marker.exists(), "the worker was not killed at its ack"
        info = await app.job(job_id)
        assert info is not None and info.state == "running" and not info.has_result, info
        with pytest.raises(TimeoutError):
            await app.result(job_id, timeout=0.3)
        # Another worker takes the job over once the dead one's lease has expired.
        async with running(app.worker()):
            assert await app.result(job_id, timeout=LEASE_TTL * 10) == 40
        info = await app.job(job_id)
        assert info is not None and info.state == "succeeded" and info.attempts == 1
    finally:
        await app.close()
