"""``aqw worker``: run a worker until stopped (a signal, or ``--burst`` and an empty queue),
or ``--processes N`` of them under the supervisor."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

from .._text import error_line
from ..brokers.base import Broker
from ..brokers.multi import queue_plan
from ..errors import BrokerUnavailable, ConfigError, extra_hint
from ..telemetry import configure_otel, shutdown_otel
from ..worker import Worker
from ._common import (
    EXIT_INTERRUPTED,
    add_log_options,
    add_target,
    env_float,
    env_int,
    integer,
    number,
    resolve_app,
    target_options,
)
from .supervisor import run_supervised, worker_argv

log = logging.getLogger("aqw.cli")
log_of_worker = logging.getLogger("aqw.worker")

#: The event loops ``aqw worker --loop`` runs on.
LOOPS = ("asyncio", "uvloop")


def add_parser(sub: Any) -> None:
    """Add ``aqw worker`` to the command line's subparsers."""
    w = sub.add_parser("worker", help="run a worker", description="Run a worker until stopped.")
    add_target(w, positional_app=True)
    w.add_argument(
        "-c",
        "--concurrency",
        type=integer(1),
        metavar="N",
        help="most jobs at once, >= 1 (default AQW_CONCURRENCY, else 100)",
    )
    w.add_argument(
        "--prefetch",
        type=integer(0),
        metavar="N",
        help="jobs fetched ahead of free slots, >= 0 (default AQW_PREFETCH, else 0)",
    )
    w.add_argument(
        "--grace",
        type=number(0),
        metavar="SECONDS",
        help="seconds to finish jobs on shutdown, >= 0 (default AQW_GRACE, else 30)",
    )
    w.add_argument(
        "--queues",
        type=_checked_queues,
        metavar="Q1,Q2|Q1=W1,Q2=W2",
        help="serve several queues with one pool of slots: in strict order (high,default,low) "
        "or by weight (high=5,default=3,low=1) (default AQW_QUEUES, else --queue alone)",
    )
    w.add_argument(
        "--priority-share",
        type=number(0),
        metavar="SHARE",
        help="the lower priority levels' share of fetches, 0 to 1; 0: strict priority "
        "(default AQW_PRIORITY_SHARE, else 0.05)",
    )
    w.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    w.add_argument(
        "--wait-for-broker",
        type=number(0),
        metavar="SECONDS",
        help="wait up to this long for the broker to answer before starting (a compose "
        "file's start-up race), saying so every few seconds; 0: exit at once with one line "
        "(for systemd or Kubernetes to restart) (default AQW_WAIT_FOR_BROKER, else 0)",
    )
    w.add_argument(
        "--loop",
        choices=LOOPS,
        help="the event loop: asyncio, or uvloop from the aqw[uvloop] extra "
        "(default AQW_LOOP, else asyncio)",
    )
    w.add_argument(
        "-p",
        "--processes",
        type=integer(1),
        metavar="N",
        help="supervised worker processes, one event loop each, >= 1 "
        "(default AQW_PROCESSES, else 1)",
    )
    add_log_options(w)


def parse_queues(text: str) -> list[str] | dict[str, float]:
    """``--queues``: ``a,b,c`` (strict order) or ``a=5,b=3,c=1`` (weights); a ConfigError
    naming ``queues`` for an empty list, a duplicate, a bad name or a weight <= 0."""
    if not text.strip():
        raise ConfigError("queues: name at least one queue")
    parts = [part.strip() for part in text.split(",")]
    if not any("=" in part for part in parts):
        queue_plan(parts)
        return parts
    weights: dict[str, float] = {}
    for part in parts:
        name, eq, weight = part.partition("=")
        if not eq:
            raise ConfigError(f"queues: give every queue a weight or none ({name!r} has none)")
        if name in weights:
            raise ConfigError(f"queues: {name!r} is named twice")
        try:
            weights[name] = float(weight)
        except ValueError:
            raise ConfigError(
                f"queues: the weight of {name!r} must be a number > 0, got {weight!r}"
            ) from None
    queue_plan(weights)
    return weights


def _checked_queues(text: str) -> str:
    try:
        parse_queues(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def loop_runner(args: argparse.Namespace) -> Callable[[Coroutine[Any, Any, int]], int]:
    """What runs the worker's coroutine: ``asyncio.run``, or an ``asyncio.Runner`` on a
    uvloop event loop for ``--loop uvloop`` (or ``AQW_LOOP=uvloop``); a ConfigError naming
    the setting for an unknown loop, or naming the extra when uvloop is not installed."""
    loop: str | None = args.loop
    source = "--loop"
    if loop is None:
        loop, source = os.environ.get("AQW_LOOP") or "asyncio", "AQW_LOOP"
    if loop not in LOOPS:
        raise ConfigError(f"{source}: choose asyncio or uvloop, got {loop!r}")
    if loop == "asyncio":
        return asyncio.run
    try:
        import uvloop
    except ImportError:
        raise ConfigError(
            f"{source} uvloop: uvloop is not installed; {extra_hint('uvloop')}"
        ) from None

    def run_on_uvloop(coro: Coroutine[Any, Any, int]) -> int:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)

    return run_on_uvloop


def processes(args: argparse.Namespace) -> int:
    """Worker processes from ``--processes`` or ``AQW_PROCESSES`` (default 1)."""
    count: int | None = args.processes
    if count is None:
        count = env_int("AQW_PROCESSES", 1, minimum=1)
    return count


def run_processes(args: argparse.Namespace) -> int:
    """``aqw worker --processes N``: N supervised worker processes. Blocks; call it outside
    an event loop (the supervisor owns the signals of its children)."""
    loop_runner(args)  # a loop that cannot run is one error here, not one per process
    return run_supervised(worker_argv(args), processes(args))


def freeze_start_up_heap() -> None:
    """Collect once, then move every object alive after start-up (modules, the app, the
    worker: some 50,000 objects) to the collector's permanent generation, so that a full
    collection later walks only what was made since: about 10 ms less each, at no cost to
    the frequent young collections (measured in docs/benchmarks.md)."""
    gc.collect()
    gc.freeze()


#: Seconds between two "waiting for the broker" lines of ``--wait-for-broker``.
WAIT_SAY_EVERY = 5.0
#: Pauses between two tries to reach the broker: first and longest, in seconds.
WAIT_FIRST, WAIT_MAX = 0.1, 1.0


async def start_when_reachable(worker: Worker, where: str, wait: float) -> None:
    """``worker.start()``, tried again while the broker cannot be reached, for up to ``wait``
    seconds (0: once): one line when it starts waiting and one every ``WAIT_SAY_EVERY``
    seconds, then ``BrokerUnavailable`` (the command's one error line) if it never answered.

    Why not wait by default: under systemd (``Restart=on-failure``) or Kubernetes (a pod's
    restart with backoff, its readiness) a worker that exits at once, with the reason, is
    restarted by something that counts and reports the failures. A compose file starts the
    worker and Redis together, and the worker would lose that race every time."""
    deadline = time.monotonic() + wait
    pause, said = WAIT_FIRST, -math.inf
    while True:
        try:
            await worker.start()
            return
        except BrokerUnavailable as exc:
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                if wait > 0:
                    raise BrokerUnavailable(
                        f"{exc} (no answer for {wait:g}s of --wait-for-broker)"
                    ) from exc
                raise
            if now - said >= WAIT_SAY_EVERY:
                said = now
                log.warning(
                    "waiting for the broker %s to answer (%s); up to %.0fs more",
                    where,
                    error_line(exc.__cause__ or exc),
                    left,
                )
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, WAIT_MAX)


async def run(args: argparse.Namespace) -> int:
    """``aqw worker``: one worker in this process, until stopped; prints its counts."""
    app = resolve_app(args)
    if configure_otel("aqw-worker"):
        log.info("OpenTelemetry SDK configured from OTEL_* environment variables")
    concurrency: int | None = args.concurrency
    if concurrency is None:
        concurrency = env_int("AQW_CONCURRENCY", 100, minimum=1)
    prefetch: int | None = args.prefetch
    if prefetch is None:
        prefetch = env_int("AQW_PREFETCH", 0, minimum=0)
    grace: float | None = args.grace
    if grace is None:
        grace = env_float("AQW_GRACE", 30.0, minimum=0.0)
    queues: str | None = args.queues or os.environ.get("AQW_QUEUES") or None
    share: float | None = args.priority_share
    if share is None:
        share = env_float("AQW_PRIORITY_SHARE", Broker.priority_share, minimum=0.0)
    worker = app.worker(
        concurrency=concurrency,
        prefetch=prefetch,
        grace=grace,
        burst=args.burst,
        handle_signals=True,
        queues=None if queues is None else parse_queues(queues),
        priority_share=share,
    )
    worker.hints.target = target_options(args)  # for the hints of its log lines
    wait: float | None = args.wait_for_broker
    if wait is None:
        wait = env_float("AQW_WAIT_FOR_BROKER", 0.0, minimum=0.0)
    started = time.perf_counter()
    try:
        await start_when_reachable(worker, app.broker.describe(), wait)
        freeze_start_up_heap()
        try:
            await worker.wait_stopped()
        finally:
            await worker.stop()
    finally:
        await app.close()
        shutdown_otel()
    if not log_of_worker.isEnabledFor(logging.INFO):  # else its stop line said it
        elapsed = time.perf_counter() - started
        print(f"aqw worker: {worker.stats.summary()} in {elapsed:.1f}s", file=sys.stderr)
    return EXIT_INTERRUPTED if worker.stopping.signal == signal.SIGINT else 0
