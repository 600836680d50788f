"""``python -m aqw ...`` runs for the command-line tests, forked by ``tests/_fork_server.py``
(one per test process, started on first use) instead of started afresh: the same exit
status, output, environment and working directory as ``subprocess.run``, without aqw's
start-up each time. ``run_aqw`` falls back to ``subprocess.run`` where ``fork`` is missing."""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, overload

ROOT = Path(__file__).resolve().parents[1]
SERVER = Path(__file__).with_name("_fork_server.py")

_server: subprocess.Popen[str] | None = None
_one_at_a_time = threading.Lock()


def _started() -> subprocess.Popen[str]:
    global _server
    if _server is None or _server.poll() is not None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        _server = subprocess.Popen(
            [sys.executable, str(SERVER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        atexit.register(_stop, _server)
    return _server


def _stop(server: subprocess.Popen[str]) -> None:
    assert server.stdin is not None and server.stdout is not None
    server.stdin.close()
    try:
        server.wait(10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    server.stdout.close()


def _answer(server: subprocess.Popen[str], timeout: float | None) -> dict[str, int] | None:
    assert server.stdout is not None
    ready, _, _ = select.select([server.stdout], [], [], timeout)
    if not ready:
        return None
    line = server.stdout.readline()
    if not line:
        raise RuntimeError(f"the fork server ended (exit status {server.wait()})")
    answer: dict[str, int] = json.loads(line)
    return answer


@overload
def run_aqw(
    argv: Sequence[str],
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 30,
    *,
    text: Literal[True] = True,
) -> subprocess.CompletedProcess[str]: ...
@overload
def run_aqw(
    argv: Sequence[str],
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 30,
    *,
    text: Literal[False],
) -> subprocess.CompletedProcess[bytes]: ...
def run_aqw(
    argv: Sequence[str],
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 30,
    *,
    text: bool = True,
) -> subprocess.CompletedProcess[str] | subprocess.CompletedProcess[bytes]:
    """``python -m aqw *argv`` in ``cwd`` (default: here) with exactly ``env`` (default:
    this process's), as ``subprocess.run(..., capture_output=True, timeout=timeout)`` would
    run it; one at a time per test process."""
    request = {
        "argv": list(argv),
        "cwd": str(cwd or Path.cwd()),
        "env": dict(os.environ if env is None else env),
    }
    return _forked([sys.executable, "-m", "aqw", *argv], request, timeout, text)


def run_script(
    script: Path, cwd: Path | None = None, env: Mapping[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """``python script`` in ``cwd`` with exactly ``env``, as ``run_aqw`` runs a command."""
    request = {
        "argv": [],
        "script": str(script),
        "cwd": str(cwd or Path.cwd()),
        "env": dict(os.environ if env is None else env),
    }
    done: subprocess.CompletedProcess[str] = _forked(
        [sys.executable, str(script)], request, timeout, True
    )
    return done


def _forked(
    args: list[str], request: Mapping[str, object], timeout: float, text: bool
) -> subprocess.CompletedProcess[Any]:
    with _one_at_a_time, tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp, "out"), Path(tmp, "err")
        server = _started()
        assert server.stdin is not None
        server.stdin.write(json.dumps({**request, "out": str(out), "err": str(err)}) + "\n")
        server.stdin.flush()
        started = _answer(server, 30)
        if started is None:
            raise RuntimeError("the fork server did not answer")
        ended = _answer(server, timeout)
        if ended is None:
            os.killpg(started["pid"], signal.SIGKILL)
            _answer(server, 30)
            raise subprocess.TimeoutExpired(args, timeout, out.read_bytes(), err.read_bytes())
        if text:
            said = (out.read_text(errors="replace"), err.read_text(errors="replace"))
            return subprocess.CompletedProcess(args, ended["status"], *said)
        return subprocess.CompletedProcess(
            args, ended["status"], out.read_bytes(), err.read_bytes()
        )
