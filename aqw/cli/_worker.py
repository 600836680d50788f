"""``aqw worker``: run a worker until stopped (a signal, or ``--burst`` and an empty queue),
or ``--processes N`` of them under the supervisor."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

from ..telemetry import configure_otel, shutdown_otel
from ._common import CliError, add_target, env_float, env_int, resolve_app
from .supervisor import run_supervised, worker_argv

log = logging.getLogger("aqw.cli")


def add_parser(sub: Any) -> None:
    """Add ``aqw worker`` to the command line's subparsers."""
    w = sub.add_parser("worker", help="run a worker")
    add_target(w, positional_app=True)
    w.add_argument("-c", "--concurrency", type=int, help="most jobs at once (default 100)")
    w.add_argument("--prefetch", type=int, help="jobs fetched ahead of free slots (default 0)")
    w.add_argument("--grace", type=float, help="seconds to finish jobs on shutdown (default 30)")
    w.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    w.add_argument(
        "-p",
        "--processes",
        type=int,
        help="supervised worker processes, one event loop each (default 1, or AQW_PROCESSES)",
    )


def processes(args: argparse.Namespace) -> int:
    """Worker processes from ``--processes`` or ``AQW_PROCESSES`` (default 1)."""
    count: int | None = args.processes
    if count is None:
        count = env_int("AQW_PROCESSES", 1)
    if count < 1:
        raise CliError(f"--processes must be >= 1, got {count}")
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
    concurrency = args.concurrency or env_int("AQW_CONCURRENCY", 100)
    prefetch = args.prefetch if args.prefetch is not None else env_int("AQW_PREFETCH", 0)
    grace = args.grace if args.grace is not None else env_float("AQW_GRACE", 30.0)
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
