"""A process that has imported aqw and forks a ``python -m aqw ...`` run (or a
``python script.py`` one) for each request:
the command-line tests get a process of its own per command (its exit status, its stdout
and stderr, its environment and working directory) without paying aqw's start-up again
each time (about 0.5 s of CPU per command, most of the command-line tests' cost).

Protocol, one JSON object per line: a request ``{"argv", "cwd", "env", "out", "err"}``
(and ``"script"``: that file run as ``__main__`` with ``argv`` as its arguments) on
stdin; the answer ``{"pid": N}`` at once, then ``{"status": S}`` when the run ended (S as
``subprocess`` gives it: negative for a signal). It stops when its stdin closes.

Only for commands that need nothing a fresh interpreter would do differently: nothing here
has started a thread, an event loop or logging, and a module the run's own ``sys.path``
would shadow (a project's ``uvloop.py``) is one this process has not imported.

With ``--many`` (``tests/_spawn.py``): the worker scripts of the multi-process tests, many
at a time. A request carries an ``"id"``, its ``"out"`` file takes stdout and stderr both
(appended to); the answers ``{"id", "pid"}`` and later ``{"id", "status"}``. This mode also
imports the PostgreSQL and NATS brokers' clients first. When stdin closes, the runs still
going are killed."""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import runpy
import select
import signal
import sys
import traceback

import aqw
import aqw.brokers.redis
import aqw.cli  # noqa: F401

#: This process's own search path, less the entries ``python`` added for it (its script's
#: directory, its PYTHONPATH): a run puts its own in front.
_OWN = set(os.environ.get("PYTHONPATH", "").split(os.pathsep)) | {sys.path[0]}
BASE_PATH = [p for p in sys.path if p not in _OWN]


def _child(request: dict[str, object]) -> int:
    """In the forked process: become ``python -m aqw *argv`` in ``cwd`` with ``env``; its
    exit status (the interpreter then ends as any would: atexit, logging's flush)."""
    os.setsid()  # its own process group: a timeout kills it and what it started
    cwd, env = str(request["cwd"]), request["env"]
    assert isinstance(env, dict)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    script = request.get("script")
    first = os.path.dirname(os.path.abspath(str(script))) if script else cwd
    sys.path[:] = [first, *extra, *BASE_PATH]
    null = os.open(os.devnull, os.O_RDONLY)
    if "err" in request:
        out = os.open(str(request["out"]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        err = os.open(str(request["err"]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    else:  # one log for both, appended to (as a file several processes were handed)
        out = os.open(str(request["out"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        err = os.dup(out)
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    argv = request["argv"]
    assert isinstance(argv, list)
    sys.argv = [str(script) if script else "aqw", *map(str, argv)]
    try:
        if script:
            runpy.run_path(str(script), run_name="__main__")
        else:
            runpy.run_module("aqw", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _end(code: int) -> None:
    """End the child as an interpreter ends, less the teardown of every module (a tenth of
    a second each time): a collection (the finalizers that warn of what was left open),
    the exit handlers (logging's flush), then stdio."""
    try:
        gc.collect()  # what a teardown would finalize and warn about (an unclosed client)
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                code = _child(request)
            except BaseException:
                traceback.print_exc()
                code = 1
            _end(code)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"status": os.waitstatus_to_exitcode(status)}), flush=True)


def _fork(request: dict[str, object]) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            code = _child(request)
        except BaseException:
            traceback.print_exc()
            code = 1
        _end(code)
    return pid


def _say(message: dict[str, object]) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def many() -> None:
    """Serve ``--many``: fork each request at once, report each run's end as it comes."""
    import asyncpg  # noqa: F401 - imported once here instead of in every run
    import nats  # noqa: F401

    import aqw.brokers.nats
    import aqw.brokers.postgres
    import aqw.idempotency
    import aqw.worker  # noqa: F401

    running: dict[int, object] = {}
    pending = b""
    open_ = True
    while open_ or running:
        if open_:
            ready, _, _ = select.select([0], [], [], 0.05)  # and a look at the runs' ends
            if ready:
                chunk = os.read(0, 65536)
                if not chunk:
                    open_ = False
                    for pid in running:  # the test process ended: nothing waits for them
                        with contextlib.suppress(OSError):
                            os.killpg(pid, signal.SIGKILL)
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    request = json.loads(line)
                    pid = _fork(request)
                    running[pid] = request["id"]
                    _say({"id": request["id"], "pid": pid})
        else:
            select.select([], [], [], 0.05)
        while running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid in running:
                _say({"id": running.pop(pid), "status": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    if sys.argv[1:] == ["--many"]:
        many()
    else:
        main()
