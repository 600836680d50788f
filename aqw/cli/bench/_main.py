"""``aqw bench``: find the worker settings that give the most jobs/s on your broker.

For every combination of ``--processes``, ``--concurrency`` and ``--prefetch`` it runs two
phases against a fresh, private queue on the broker you name:

1. **drain**: ``--jobs`` jobs are enqueued, then the workers start; jobs/s is the rate at
   which they finish (between the 10th and the 90th percentile of completions, so process
   start-up does not count);
2. **latency**: the workers keep running while jobs are offered at half that rate for
   ``--latency-seconds``; p50/p99 are their end-to-end latencies, enqueue to acknowledgement.

Per setting it also reports the workers' CPU seconds per 1,000 jobs (``time.process_time``
of the worker processes) and, on a real Redis, the server commands per job (``INFO
commandstats`` deltas, producer included, commands inside scripts counted; other clients of
the same server add noise). The recommendation is the smallest setting (fewest processes,
then concurrency, then prefetch) within 5% of the best throughput.

The jobs are synthetic (``--work noop|sleep|cpu|mix``) or one of your tasks with a sample
payload (``--app MODULE:APP --task NAME --payload JSON``: it really runs, side effects
included). Workers run in child processes (``memory://`` lives in one process, so there they
run in this one). Every key the bench writes (``aqw:{queue}:*`` on Redis) is deleted at the
end, also after Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from ...brokers import from_url
from ...errors import ConfigError, UnknownTask
from .._common import (
    CliError,
    Parser,
    add_log_options,
    integer,
    load_app,
    log_options,
    number,
    setup_logging,
)
from ._measure import Point, delete_queue, measure
from ._report import Progress, recommend, redact, report

__all__ = ["Point", "add_parser", "main", "recommend", "run"]


@dataclass(frozen=True)
class _Defaults:
    concurrency: list[int]
    prefetch: list[int]
    processes: list[int]
    jobs: int
    latency_seconds: float
    timeout: float


QUICK = _Defaults([10, 50], [0, 20], [1], jobs=300, latency_seconds=0.3, timeout=30.0)
FULL = _Defaults(
    [10, 50, 100, 200],
    [0, 50],
    sorted({1, min(os.cpu_count() or 1, 8)}),
    jobs=3000,
    latency_seconds=1.0,
    timeout=120.0,
)


class _Interrupted(Exception):
    """A signal asked the bench to stop."""


# -- the command --------------------------------------------------------------------------------


DESCRIPTION = (
    "Sweep --processes x --concurrency x --prefetch on a private queue of your broker. Per "
    "setting: drain --jobs jobs (jobs/s), then offer jobs at half that rate for "
    "--latency-seconds (p50/p99 latency, enqueue to acknowledgement). Also shows the workers' "
    "CPU seconds per 1,000 jobs and, on Redis, server commands per job, and recommends the "
    "smallest setting within 5% of the best throughput. Every key of the bench queue is "
    "deleted at the end, also after Ctrl-C."
)


def _csv(values: list[int]) -> str:
    return ",".join(map(str, values))


def _list(minimum: int) -> Callable[[str], list[int]]:
    def parse(text: str) -> list[int]:
        try:
            values = sorted({int(v) for v in text.split(",") if v.strip()})
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list") from None
        if not values or values[0] < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: give integers >= {minimum}")
        return values

    return parse


def add_parser(sub: Any) -> None:
    """Add the ``bench`` command to the ``aqw`` command line."""
    b = sub.add_parser(
        "bench",
        help="throughput tuning: sweep processes, concurrency, prefetch",
        description=DESCRIPTION,
    )
    b.add_argument(
        "--broker",
        metavar="URL",
        help="broker URL (or AQW_BROKER; default: the app's, or memory://)",
    )
    b.add_argument(
        "--app",
        metavar="APP",
        help="run a task of this app (package.module:app) instead of synthetic jobs; "
        "AQW_APP is not read, so that an exported app never runs by surprise",
    )
    b.add_argument("--task", help="the task to run (with --app)")
    b.add_argument("--payload", default="null", metavar="JSON", help="its sample payload, as JSON")
    b.add_argument(
        "--work",
        choices=["noop", "sleep", "cpu", "mix"],
        default="noop",
        help="synthetic jobs: return, sleep, burn CPU, or each in turn",
    )
    b.add_argument(
        "--sleep-ms", type=number(0), default=10.0, metavar="MS", help="ms a sleep job sleeps"
    )
    b.add_argument(
        "--cpu-ms", type=number(0), default=1.0, metavar="MS", help="ms of CPU a cpu job burns"
    )
    b.add_argument(
        "-c",
        "--concurrency",
        type=_list(1),
        help=f"values to try (default {_csv(FULL.concurrency)}; "
        f"--quick: {_csv(QUICK.concurrency)})",
    )
    b.add_argument(
        "--prefetch",
        type=_list(0),
        help=f"values to try (default {_csv(FULL.prefetch)}; --quick: {_csv(QUICK.prefetch)})",
    )
    b.add_argument(
        "-p",
        "--processes",
        type=_list(1),
        help=f"worker process counts to try (default {_csv(FULL.processes)}; "
        f"--quick: {_csv(QUICK.processes)})",
    )
    b.add_argument(
        "-n",
        "--jobs",
        type=integer(10),
        metavar="N",
        help=f"jobs per setting in the drain phase (default {FULL.jobs}; --quick: {QUICK.jobs})",
    )
    b.add_argument(
        "--latency-seconds",
        type=number(0, above=True),
        metavar="SECONDS",
        help=f"length of the latency phase (default {FULL.latency_seconds}; "
        f"--quick: {QUICK.latency_seconds})",
    )
    b.add_argument(
        "--timeout",
        type=number(0, above=True),
        metavar="SECONDS",
        help=f"seconds each phase may take (default {FULL.timeout:.0f})",
    )
    b.add_argument("--queue", help="the bench queue (must be unused; default: a random name)")
    b.add_argument("--quick", action="store_true", help="a small grid, a few seconds")
    b.add_argument("--json", action="store_true", help="print the results as JSON")
    add_log_options(b)


def _config(args: argparse.Namespace) -> dict[str, Any]:
    grid = QUICK if args.quick else FULL
    broker = args.broker or os.environ.get("AQW_BROKER")
    payload: Any = None
    if args.app:
        user = load_app(args.app)
        broker = broker or user.broker_url
        if not args.task:
            if len(user.tasks) != 1:
                raise ConfigError(f"name the task to run: --task {'|'.join(sorted(user.tasks))}")
            args.task = next(iter(user.tasks))
        task = user.get_task(args.task)
        try:
            payload = task.validate(json.loads(args.payload))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--payload is not valid JSON: {exc}") from None
        except ValidationError as exc:
            raise ConfigError(f"--payload does not fit task {args.task!r}: {exc}") from None
    elif args.task:
        raise ConfigError("--task needs --app MODULE:APP")
    broker = broker or "memory://"
    in_process = urlsplit(broker).scheme == "memory"
    processes = args.processes or grid.processes
    if in_process and processes != [1]:
        print("aqw bench: memory:// lives in one process: --processes 1 only", file=sys.stderr)
        processes = [1]
    jobs = args.jobs or grid.jobs
    if jobs < 10:
        raise ConfigError("--jobs must be >= 10")
    return {
        "broker": broker,
        "queue": args.queue or f"aqw-bench-{uuid.uuid4().hex[:8]}",
        "app": args.app,
        "task": args.task,
        "payload": payload,
        "work": args.work,
        "sleep_ms": args.sleep_ms,
        "cpu_ms": args.cpu_ms,
        "in_process": in_process,
        "jobs": jobs,
        "timeout": args.timeout or grid.timeout,
        "latency_seconds": args.latency_seconds or grid.latency_seconds,
        "grid": [
            (pr, c, pf)
            for pr in processes
            for c in (args.concurrency or grid.concurrency)
            for pf in (args.prefetch if args.prefetch is not None else grid.prefetch)
        ],
    }


async def run(args: argparse.Namespace) -> int:
    """Run ``aqw bench``; returns the exit status (0 when at least one setting ran)."""
    cfg = _config(args)
    queue = cfg["queue"]
    if args.queue:
        probe = from_url(cfg["broker"], queue)
        try:
            if probe.server is not None and await probe.server.count_keys():
                raise ConfigError(
                    f"queue {queue!r} has keys already: the bench deletes every "
                    "key of its queue, so name an unused one"
                )
        finally:
            await probe.close()
    print(
        f"aqw bench: queue {queue} on {redact(cfg['broker'])} (deleted at the end)", file=sys.stderr
    )
    points = [Point(pr, c, pf) for pr, c, pf in cfg["grid"]]
    progress = Progress(len(points))
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    stopped_by: list[int] = []

    def on_signal(sig: int) -> None:
        # Cancel, and also raise from the next progress tick: on Python 3.11 a cancel that
        # lands as a redis-py send completes can be swallowed by asyncio.wait_for.
        if not stopped_by and main is not None:
            stopped_by.append(sig)
            main.cancel()

    quiet = logging.getLogger("aqw.worker")  # no start/stop lines per setting
    level = quiet.level
    quiet.setLevel(max(logging.WARNING, quiet.getEffectiveLevel()))
    signals = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # not a background job
        signals.append(signal.SIGINT)
    for sig in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal, sig)
    try:
        for i, point in enumerate(points):

            def tick(phase: str, done: int, target: int, i: int = i, point: Point = point) -> None:
                if stopped_by:
                    raise _Interrupted
                progress.tick(i, point, phase, done, target)

            try:
                with contextlib.redirect_stdout(sys.stderr):  # what tasks print (memory://)
                    await measure(cfg, point, tick)
            except (TimeoutError, ConfigError, OSError) as exc:
                point.error = str(exc) or type(exc).__name__
            progress.point_done(i, point)
        if stopped_by:
            raise _Interrupted
    except (asyncio.CancelledError, _Interrupted):
        print("\naqw bench: interrupted; cleaning up", file=sys.stderr)
        if stopped_by:
            return 128 + stopped_by[0]
        raise
    finally:
        quiet.setLevel(level)
        for sig in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        deleted = await delete_queue(cfg["broker"], queue)
        if urlsplit(cfg["broker"]).scheme not in ("memory", "redis", "rediss", "unix"):
            print(
                f"aqw bench: leftover messages of queue {queue} are not deleted on this broker",
                file=sys.stderr,
            )
        logging.getLogger("aqw.bench").debug("deleted %d keys of queue %s", deleted, queue)
    report(cfg, points, as_json=args.json)
    return 0 if any(p.jobs_per_s for p in points) else 1


def main(argv: list[str] | None = None) -> int:
    """``python -m aqw.cli.bench._main ...``: the ``aqw bench`` command on its own."""
    parser = Parser(prog="aqw")
    add_log_options(parser, "WARNING")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    try:
        level, fmt = log_options(args, "WARNING")
        setup_logging(level, fmt=fmt)
        return asyncio.run(run(args))
    except (CliError, ConfigError, UnknownTask) as exc:
        print(f"aqw: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
