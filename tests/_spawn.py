"""The worker scripts of the multi-process tests (chaos runs, kills, pauses), forked by
``tests/_fork_server.py --many`` (one per test process, started on first use) instead of
started afresh: a fresh interpreter costs about 0.8 s of CPU to import aqw and a broker's
client before it does anything, and a chaos run starts two dozen of them.

``spawn_script`` stands in for ``asyncio.create_subprocess_exec(sys.executable, script,
*args, env=..., cwd=..., stdout=log, stderr=log)``: the run is a process of its own (its own
pid, signals, process group and exit status), stdout and stderr appended to ``log``; the
``Forked`` it returns has what the tests use of ``asyncio.subprocess.Process``. A script
that needs a fresh interpreter (one that tests start-up itself) keeps the real thing."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
SERVER = Path(__file__).with_name("_fork_server.py")


class _Server:
    """The fork server of this test process, and what it said of each run."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), "--many"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self.pids: dict[int, int] = {}
        self.status: dict[int, int] = {}
        self.ended = False
        self._said = threading.Condition()
        self._ids = itertools.count(1)
        threading.Thread(target=self._read, daemon=True).start()
        atexit.register(self.stop)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            message = json.loads(line)
            with self._said:
                if "pid" in message:
                    self.pids[message["id"]] = message["pid"]
                else:
                    self.status[message["id"]] = message["status"]
                self._said.notify_all()
        with self._said:
            self.ended = True
            self._said.notify_all()

    def start(self, request: Mapping[str, object]) -> tuple[int, int]:
        assert self.proc.stdin is not None
        with self._said:
            run = next(self._ids)
            self.proc.stdin.write((json.dumps({**request, "id": run}) + "\n").encode())
            self.proc.stdin.flush()
            if not self._said.wait_for(lambda: run in self.pids or self.ended, 30):
                raise RuntimeError("the fork server did not answer")
            if run not in self.pids:
                raise RuntimeError(f"the fork server ended (exit status {self.proc.poll()})")
            return run, self.pids[run]

    def stop(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_server: _Server | None = None
_starting = threading.Lock()


def _started() -> _Server:
    global _server
    with _starting:
        if _server is None or _server.ended or _server.proc.poll() is not None:
            _server = _Server()
        return _server


class Forked:
    """A forked run of a script: pid, returncode, send_signal, kill, terminate, wait."""

    def __init__(self, server: _Server, run: int, pid: int) -> None:
        self._server = server
        self._run = run
        self.pid = pid

    @property
    def returncode(self) -> int | None:
        code = self._server.status.get(self._run)
        if code is None and self._server.ended:
            return -signal.SIGKILL  # the server went with its runs
        return code

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    async def wait(self) -> int:
        while (code := self.returncode) is None:  # noqa: ASYNC110 - set by the reader thread
            await asyncio.sleep(0.02)
        return code


async def spawn_script(
    script: Path | str,
    *args: object,
    log: IO[Any] | Path | str,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
) -> Forked:
    """``python script *args`` with exactly ``env`` (default: this process's) in ``cwd``
    (default: here), its stdout and stderr appended to ``log`` (an open file or a path)."""
    path = log if isinstance(log, (str, Path)) else log.name
    if not isinstance(log, (str, Path)):
        log.flush()  # noqa: ASYNC240 - what the test wrote first comes first
    request = {
        "argv": [str(a) for a in args],
        "script": os.path.abspath(script),  # noqa: ASYNC240 - no I/O: a path joined
        "cwd": str(cwd or Path.cwd()),
        "env": dict(os.environ if env is None else env),
        "out": str(path),
    }
    server = _started()
    run, pid = await asyncio.to_thread(server.start, request)
    return Forked(server, run, pid)
