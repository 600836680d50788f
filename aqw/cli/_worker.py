"""``aqw worker``: run a worker until stopped (a signal, or ``--burst`` and an empty queue),
or ``--processes N`` of them under the supervisor."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

from ..telemetry import configure_otel, shutdown_otel
from ._common import (
    add_log_options,
    add_target,
    env_float,
    env_int,
    integer,
    number,
    resolve_app,
)
from .supervisor import run_supervised, worker_argv

log = logging.getLogger("aqw.cli")


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
    w.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    w.add_argument(
        "-p",
        "--processes",
        type=integer(1),
        metavar="N",
        help="supervised worker processes, one event loop each, >= 1 "
        "(default AQW_PROCESSES, else 1)",
    )
    add_log_options(w)


def processes(args: argparse.Namespace) -> int:
    """Worker processes from ``--processes`` or ``AQW_PROCESSES`` (default 1)."""
    count: int | None = args.processes
    if count is None:
        count = env_int("AQW_PROCESSES", 1, minimum=1)
    return count


def run_processes(args: argparse.Namespace) -> int:
    """``aqw worker --processes N``: N supervised worker processes. Blocks; call it outside
    an event loop (the supervisor owns the signals of its children)."""
    return run_supervised(worker_argv(args), processes(args))


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
    worker = app.worker(
        concurrency=concurrency,
        prefetch=prefetch,
        grace=grace,
        burst=args.burst,
        handle_signals=True,
    )
    started = time.perf_counter()
    try:
        await worker.run()
    finally:
        await app.close()
        shutdown_otel()
    elapsed = time.perf_counter() - started
    s = worker.stats
    print(
        f"aqw worker: {s.processed} processed, {s.retried} retried, {s.dead} dead-lettered, "
        f"{s.failed} failed runs in {elapsed:.1f}s",
        file=sys.stderr,
    )
    return 0
