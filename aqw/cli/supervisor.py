"""Run N worker processes, one event loop each, and keep them running.

``aqw worker APP --processes N`` starts N copies of ``python -m aqw worker APP ...`` (the same
arguments without ``--processes``) and supervises them:

- a worker that dies unexpectedly (killed, crashed, non-zero exit) is restarted after a
  backoff (0.5 s, doubling per consecutive failure of that slot, at most 30 s; reset once a
  worker ran for 30 s). More than ``max_restarts`` restarts within ``restart_window``
  seconds is a crash loop: the supervisor stops the others and exits 1;
- a worker exiting 2 (a usage or configuration error) stops everything: exit 2;
- workers that fail to start (exit 1: the broker unreachable, say) before any worker ever
  started are not restarted: once none is left running, the supervisor says so in one line
  and exits 1, as fast as one worker would. A worker counts as started once it has run for
  ``started_after`` seconds (longer than a broker connect may take) or exited 0. After
  that, a worker that fails is restarted as above (an outage that began later);
- a worker exiting 0 by itself (``--burst`` found the queue empty) is not restarted; the
  supervisor exits 0 when all have;
- SIGTERM or SIGINT is forwarded to every worker, which stops gracefully (running jobs get
  their grace period, unfinished ones are handed back). The supervisor waits for all of
  them and exits 0 (130 after SIGINT, as one worker does). The workers run in a process
  group of their own, so the Ctrl-C of a terminal reaches them once, from the supervisor,
  not also straight from the terminal (which would be the second signal below). A second
  signal is forwarded too: the workers cancel their running
  jobs and hand them back at once. Workers still running ``stop_timeout`` seconds later
  (default: the ``--grace`` plus 15 s), or 5 s after a second signal, are killed, and it
  exits 1.

On Linux the workers get SIGTERM if the supervisor itself dies, so none is left orphaned.
Jobs a killed worker was running are redelivered after their lease expires, by the broker.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from ..errors import ConfigError

log = logging.getLogger("aqw.supervisor")

__all__ = ["run_supervised", "worker_argv"]

#: Exit status of a worker that met a usage or configuration error: restarting cannot help.
EXIT_USAGE = 2

#: Exit status of a worker that failed: at start, most often the broker is unreachable.
EXIT_FAILED = 1

#: Exit status after a stop by SIGINT (Ctrl-C), as a shell reports a process it ended.
EXIT_INTERRUPTED = 128 + signal.SIGINT

POLL = 0.05

#: Seconds the workers get to stop after a second signal (they cancel their running jobs
#: and hand them back) before they are killed.
FORCED_STOP = 5.0


@dataclass
class _Slot:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    failures: int = 0
    restart_at: float | None = None
    finished: bool = False
    held: bool = False  # failed to start before any worker started: not restarted (yet)


def worker_argv(args: argparse.Namespace) -> list[str]:
    """The ``python -m aqw`` arguments of one worker of ``aqw worker ... --processes N``:
    the same settings, without ``--processes``."""
    argv: list[str] = []
    if getattr(args, "log_level", None):
        argv += ["--log-level", str(args.log_level)]
    if getattr(args, "log_format", None):
        argv += ["--log-format", str(args.log_format)]
    argv.append("worker")
    if getattr(args, "app", None):
        argv.append(str(args.app))
    for option in (
        "broker",
        "queue",
        "queues",
        "concurrency",
        "prefetch",
        "grace",
        "priority_share",
        "loop",
        "wait_for_broker",
    ):
        value = getattr(args, option, None)
        if value is not None:
            argv += [f"--{option.replace('_', '-')}", str(value)]
    if getattr(args, "burst", False):
        argv.append("--burst")
    return argv


def _grace_of(argv: Sequence[str]) -> float:
    grace = os.environ.get("AQW_GRACE") or "30"
    for i, arg in enumerate(argv):
        if arg == "--grace" and i + 1 < len(argv):
            grace = argv[i + 1]
        elif arg.startswith("--grace="):
            grace = arg.partition("=")[2]
    try:
        return float(grace)
    except ValueError:
        return 30.0


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Ask Linux to send this process SIGTERM when its parent dies."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    except Exception:
        pass


class _Supervisor:
    def __init__(
        self,
        argv: Sequence[str],
        processes: int,
        *,
        stop_timeout: float,
        max_restarts: int,
        restart_window: float,
        backoff: float,
        max_backoff: float,
        stable_after: float,
        started_after: float,
    ) -> None:
        self.command = [sys.executable, "-m", "aqw", *argv]
        self.slots = [_Slot(i) for i in range(processes)]
        self.stop_timeout = stop_timeout
        self.max_restarts = max_restarts
        self.restart_window = restart_window
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.stable_after = stable_after
        self.started_after = started_after
        self.started = False  # some worker ever got going (see the module doc)
        self.restarts: deque[float] = deque()
        self.signals: list[int] = []
        self.status = 0

    # -- processes -------------------------------------------------------------------------

    def _spawn(self, slot: _Slot) -> None:
        # AQW_PROCESSES=1: a worker must not start a supervisor of its own.
        env = dict(os.environ, AQW_WORKER_INDEX=str(slot.index), AQW_PROCESSES="1")
        preexec: Callable[[], None] | None = _die_with_parent if sys.platform == "linux" else None
        # Linux: a group of its own (a terminal's Ctrl-C goes to the supervisor alone, which
        # forwards it), and the death signal above in case the supervisor dies.
        group = 0 if preexec is not None else None
        slot.proc = subprocess.Popen(self.command, env=env, preexec_fn=preexec, process_group=group)
        slot.started = time.monotonic()
        slot.restart_at = None
        log.info("started worker %d (pid %d)", slot.index, slot.proc.pid)

    def _alive(self) -> list[_Slot]:
        return [s for s in self.slots if s.proc is not None and s.proc.poll() is None]

    def _send(self, sig: int) -> None:
        for slot in self._alive():
            assert slot.proc is not None
            with contextlib.suppress(ProcessLookupError):
                slot.proc.send_signal(sig)

    # -- the loop --------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)

    def run(self) -> int:
        for slot in self.slots:
            self._spawn(slot)
        while not self.signals:
            now = time.monotonic()
            self._check_started(now)
            for slot in self.slots:
                exited = slot.proc is not None and slot.proc.poll() is not None
                if exited and not self._exited(slot, now):
                    return self._shutdown(signal.SIGTERM)
                if slot.restart_at is not None and now >= slot.restart_at:
                    self._spawn(slot)
            if all(slot.finished for slot in self.slots):
                log.info("every worker finished")
                return self.status
            time.sleep(POLL)
        return self._shutdown(self.signals[0])

    def _check_started(self, now: float) -> None:
        """Once a worker has run ``started_after`` seconds, restart the held ones."""
        if self.started or not any(now - s.started >= self.started_after for s in self._alive()):
            return
        self.started = True
        for slot in self.slots:
            if slot.held:
                slot.held = False
                slot.restart_at = now
                log.warning("worker %d failed to start; restarting it now others run", slot.index)

    def _exited(self, slot: _Slot, now: float) -> bool:
        """Handle a worker that exited; False when the supervisor must stop."""
        assert slot.proc is not None
        code, pid = slot.proc.returncode, slot.proc.pid
        slot.proc = None
        if code == EXIT_FAILED and not self.started:
            return self._failed_to_start(slot)
        if code == 0:
            self.started = True
            log.info("worker %d (pid %d) finished", slot.index, pid)
            slot.finished = True
            return True
        if code == EXIT_USAGE:
            log.error(
                "worker %d (pid %d) exited %d (usage or configuration error): stopping",
                slot.index,
                pid,
                code,
            )
            self.status = EXIT_USAGE
            return False
        while self.restarts and self.restarts[0] < now - self.restart_window:
            self.restarts.popleft()
        if len(self.restarts) >= self.max_restarts:
            log.error(
                "worker %d (pid %d) exited %d; %d restarts within %.0fs: giving up",
                slot.index,
                pid,
                code,
                len(self.restarts),
                self.restart_window,
            )
            self.status = 1
            return False
        if now - slot.started >= self.stable_after:
            slot.failures = 0
        slot.failures += 1
        delay = min(self.max_backoff, self.backoff * 2 ** (slot.failures - 1))
        self.restarts.append(now)
        slot.restart_at = now + delay
        how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited {code}"
        log.warning("worker %d (pid %d) %s; restarting in %.2fs", slot.index, pid, how, delay)
        return True

    def _failed_to_start(self, slot: _Slot) -> bool:
        """A worker exited 1 before any worker started: hold it; give up once none runs."""
        slot.held = True
        if self._alive() or any(s.restart_at is not None for s in self.slots):
            log.debug("worker %d failed to start; waiting for the others", slot.index)
            return True
        held = sum(
            s.held or (s.proc is not None and s.proc.poll() == EXIT_FAILED) for s in self.slots
        )
        log.error(
            "no worker could start (%d of %d exited %d, most often: the broker is unreachable; "
            "see their errors above): giving up without restarting them",
            held,
            len(self.slots),
            EXIT_FAILED,
        )
        self.status = EXIT_FAILED
        return False

    def _shutdown(self, sig: int) -> int:
        name = _signal_name(sig)
        alive = self._alive()
        log.info("stopping %d workers (%s)", len(alive), name)
        self._send(sig)
        deadline = time.monotonic() + self.stop_timeout
        handled = len(self.signals)
        forced = False
        while self._alive():
            if len(self.signals) > max(handled, 1) and not forced:
                # The workers' own second-signal path: cancel the running jobs and hand
                # them back at once. Killed only if that does not end them soon.
                forced = True
                log.warning(
                    "second signal: the workers stop at once (running jobs handed back); "
                    "killing any still running in %.0fs",
                    FORCED_STOP,
                )
                self._send(sig)
                deadline = min(deadline, time.monotonic() + FORCED_STOP)
            if time.monotonic() > deadline:
                log.warning("workers still running after %.0fs: killing them", self.stop_timeout)
                break
            time.sleep(POLL)
        killed = self._alive()
        for slot in killed:
            assert slot.proc is not None
            with contextlib.suppress(ProcessLookupError):
                slot.proc.kill()
        for slot in self.slots:
            if slot.proc is not None:
                code = slot.proc.wait()
                if code not in (0, 128 + sig, -sig, -signal.SIGKILL) and self.status == 0:
                    log.warning(
                        "worker %d (pid %d) exited %d while stopping",
                        slot.index,
                        slot.proc.pid,
                        code,
                    )
        log.info("all workers stopped")
        if killed and self.status == 0:
            return 1
        if self.status == 0 and sig == signal.SIGINT and self.signals:
            return EXIT_INTERRUPTED  # stopped by Ctrl-C, as one worker exits
        return self.status


def run_supervised(
    argv: list[str],
    processes: int,
    *,
    stop_timeout: float | None = None,
    max_restarts: int = 10,
    restart_window: float = 60.0,
    backoff: float = 0.5,
    max_backoff: float = 30.0,
    stable_after: float = 30.0,
    started_after: float = 10.0,
) -> int:
    """Run ``processes`` workers (``python -m aqw`` + ``argv``, e.g. ``["worker",
    "pkg.jobs:app", "--concurrency", "64"]``) until they finish or a signal stops them,
    restarting any that dies unexpectedly. Blocks; call it from the main thread, outside an
    event loop. Returns the exit status: 0 after a graceful stop (or when every worker
    finished), 1 after a crash loop, when no worker could start, or when workers had to be
    killed, 2 when a worker met a usage or configuration error.

    Args:
        argv: the worker's command-line arguments, without ``--processes``.
        processes: how many workers to run (>= 1).
        stop_timeout: seconds to wait for the workers after forwarding a signal before
            killing them (default: their ``--grace``/``AQW_GRACE`` plus 15).
        max_restarts: most restarts within ``restart_window`` seconds before giving up.
        restart_window: seconds over which restarts are counted.
        backoff: seconds before the first restart of a slot; doubles per consecutive failure.
        max_backoff: longest wait before a restart.
        stable_after: seconds a worker must run for its slot's backoff to start over.
        started_after: seconds a worker must run to count as started: until one has (or
            one exited 0), workers exiting 1 are not restarted, and when none is left
            running the supervisor gives up (exit 1).
    """
    if processes < 1:
        raise ConfigError(f"--processes must be >= 1, got {processes!r}")
    supervisor = _Supervisor(
        argv,
        processes,
        stop_timeout=stop_timeout if stop_timeout is not None else _grace_of(argv) + 15.0,
        max_restarts=max_restarts,
        restart_window=restart_window,
        backoff=backoff,
        max_backoff=max_backoff,
        stable_after=stable_after,
        started_after=started_after,
    )
    previous: dict[int, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, supervisor._on_signal)
    try:
        return supervisor.run()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for slot in supervisor._alive():  # only on an unexpected error above
            assert slot.proc is not None
            slot.proc.kill()
            slot.proc.wait()
