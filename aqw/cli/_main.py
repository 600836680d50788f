"""The ``aqw`` command line: ``worker``, ``enqueue``, ``status``, ``job``, ``monitor``, ``dlq``,
``cron``, ``bench``, ``batch``, ``flow``, ``outbox`` and ``db``.

Settings come from arguments first, then ``AQW_*`` environment variables (``AQW_APP``,
``AQW_BROKER``, ``AQW_QUEUE``, ``AQW_CONCURRENCY``, ``AQW_PREFETCH``, ``AQW_GRACE``,
``AQW_PROCESSES``, ``AQW_LOG_LEVEL``, ``AQW_LOG_FORMAT``). ``--log-level`` and
``--log-format`` go before or after the subcommand. Exit status: 0 done, 1 failed (the
broker unreachable, an error of aqw), 2 a usage or configuration error (one line on stderr),
6 no record of the job (``aqw job``, ``aqw status JOB_ID``); ``aqw job wait`` adds 3
(failed or dead), 4 (cancelled), 5 (expired) and 124 (timed out).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from .._redis.loaded import client_errors, cluster_redirect
from .._text import printable
from .._version import __version__
from ..errors import AqwError, ConfigError, UnknownJob, UnknownTask
from . import _batch as batch_cli
from . import _cron as cron_cli
from . import _dashboard as dashboard_cli
from . import _dlq as dlq_cli
from . import _enqueue as enqueue_cli
from . import _job as job_cli
from . import _limits as limits_cli
from . import _monitor as monitor_cli
from . import _outbox as outbox_cli
from . import _queue as queue_cli
from . import _status as status_cli
from . import _worker as worker_cli
from . import bench as bench_cli
from ._common import (
    EXIT_INTERRUPTED,
    CliError,
    Parser,
    add_log_options,
    app_argument,
    error_line,
    log_options,
    setup_logging,
)

#: Exit status: done; failed (unreachable broker, an error of aqw); a usage or set-up error.
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: Exit status: no record of the job (``aqw.UnknownJob``).
EXIT_UNKNOWN_JOB = job_cli.EXIT_UNKNOWN_JOB
#: Exit status: the reader of the output went away (as a process ended by SIGPIPE).
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE

COMMANDS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "worker": worker_cli.run,
    "enqueue": enqueue_cli.run,
    "status": status_cli.run,
    "job": job_cli.run,
    "monitor": monitor_cli.run,
    "dlq": dlq_cli.run,
    "queue": queue_cli.run,
    "cron": cron_cli.run,
    "limits": limits_cli.run,
    "dashboard": dashboard_cli.run,
    "bench": bench_cli.run,
    "batch": batch_cli.run,
    "flow": batch_cli.run,
    "outbox": outbox_cli.run_outbox,
    "db": outbox_cli.run_db,
}


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``aqw`` and its subcommands."""
    parser = Parser(
        prog="aqw",
        description="asyncio job queue worker",
        epilog="exit status: 0 done, 1 failed, 2 usage or configuration error, "
        "6 no record of the job (aqw job: see aqw job --help)",
    )
    parser.add_argument(
        "--version", action="version", version=f"aqw {__version__}", help="print the version"
    )
    add_log_options(parser, "INFO")
    sub = parser.add_subparsers(dest="command", required=True)
    worker_cli.add_parser(sub)
    enqueue_cli.add_parser(sub)
    status_cli.add_parser(sub)
    job_cli.add_parser(sub)
    monitor_cli.add_parser(sub)
    bench_cli.add_parser(sub)
    dlq_cli.add_parser(sub)
    queue_cli.add_parser(sub)
    cron_cli.add_parser(sub)
    limits_cli.add_parser(sub)
    dashboard_cli.add_parser(sub)
    batch_cli.add_parser(sub)
    outbox_cli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``aqw`` command."""
    args = build_parser().parse_args(argv)
    try:
        level, fmt = log_options(args, "INFO")
        setup_logging(level, fmt=fmt)
        app_argument(args)  # before the supervisor passes it on
        if args.command == "worker" and worker_cli.processes(args) > 1:
            # Outside asyncio.run: the supervisor owns the signals of its children.
            return worker_cli.run_processes(args)
        run = worker_cli.loop_runner(args) if args.command == "worker" else asyncio.run
        return run(COMMANDS[args.command](args))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return closed_output()
    except Exception as exc:
        status = report(exc)
        if status is None:
            raise
        return status


def closed_output() -> int:
    """The reader of our output went away (``aqw status --watch 1 | head -3``): stop
    quietly, with the status of a process ended by SIGPIPE. The broker clients wrap their
    own socket errors, so a BrokenPipeError that gets here is about stdout or stderr.
    Python would write "Exception ignored ... BrokenPipeError" when it flushes stdout at
    exit: it is pointed at /dev/null first."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            os.dup2(devnull, stream.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


async def run_command(argv: Sequence[str]) -> int:
    """Run one ``aqw`` command in the running event loop (for tests and embedding): what
    ``main`` does, the same exit status and error lines, but without setting up logging and
    without the multi-process supervisor. A usage error returns 2 (argparse has printed it)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        app_argument(args)
        return await COMMANDS[args.command](args)
    except Exception as exc:
        status = report(exc)
        if status is None:
            raise
        return status


def report(exc: Exception) -> int | None:
    """Print the one line of an error a command ended with and return its exit status, or
    None when it is not one of the expected errors (the caller re-raises it)."""
    if isinstance(exc, UnknownJob):
        status = EXIT_UNKNOWN_JOB
    elif isinstance(exc, (CliError, ConfigError, UnknownTask)):
        status = EXIT_USAGE
    elif isinstance(exc, AqwError):
        status = EXIT_FAILED
    elif (redirect := cluster_redirect(exc)) is not None:
        error_line(redirect)
        return EXIT_USAGE
    elif isinstance(exc, (ConnectionError, OSError, *client_errors())):
        error_line(f"cannot reach the broker: {printable(exc)}")
        return EXIT_FAILED
    else:
        return None
    error_line(printable(exc))
    for line in getattr(exc, "details", ()):
        error_line(f"  {printable(line)}", lead="")
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
