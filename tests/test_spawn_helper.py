"""The tests' forked worker runs (``tests/_spawn.py``) behave as the processes they stand
in for: argv, environment, working directory, one log for both streams, exit statuses and
signals."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests._helpers import eventually
from tests._spawn import spawn_script

pytestmark = pytest.mark.asyncio

SCRIPT = """
import os, sys, time
print("argv", sys.argv[1:], "env", os.environ.get("AQW_SPAWN_TEST"), "cwd", os.getcwd())
print("to stderr", file=sys.stderr)
sys.stdout.flush()
if sys.argv[1] == "wait":
    time.sleep(60)
sys.exit(int(sys.argv[2]))
"""


async def test_a_forked_script_gets_its_argv_env_and_cwd_and_exits_with_its_status(
    tmp_path: Path,
) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    log = tmp_path / "run.log"
    log.write_text("before\n")
    run = await spawn_script(
        script, "exit", 3, log=log, env={"AQW_SPAWN_TEST": "yes"}, cwd=tmp_path
    )
    assert await run.wait() == 3 and run.returncode == 3
    lines = log.read_text().splitlines()
    assert lines[0] == "before"  # appended to
    assert f"argv ['exit', '3'] env yes cwd {tmp_path}" in lines
    assert "to stderr" in lines


async def test_a_forked_script_stops_and_dies_by_signal(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    log = tmp_path / "run.log"
    run = await spawn_script(script, "wait", 0, log=log, env={})
    await eventually(
        lambda: log.exists() and "argv" in log.read_text(), 30, "the script's first line"
    )
    run.send_signal(signal.SIGSTOP)
    run.send_signal(signal.SIGCONT)
    assert run.returncode is None
    run.kill()
    assert await run.wait() == -signal.SIGKILL
    run.kill()  # a second signal to an ended run is nothing
