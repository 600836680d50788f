"""The ``aqw`` command line: ``worker``, ``enqueue``, ``status``, ``monitor``, ``dlq`` and
``bench``.

Settings come from arguments first, then ``AQW_*`` environment variables (``AQW_APP``,
``AQW_BROKER``, ``AQW_QUEUE``, ``AQW_CONCURRENCY``, ``AQW_PREFETCH``, ``AQW_GRACE``,
``AQW_PROCESSES``, ``AQW_LOG_LEVEL``, ``AQW_LOG_FORMAT``). ``--log-level`` and
``--log-format`` go before or after the subcommand. Exit status: 0 done, 1 failed (the
broker unreachable, an error of aqw), 2 a usage or configuration error (one line on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from .._redis.client import CLIENT_ERRORS
from .._text import printable
from .._version import __version__
from ..errors import AqwError, ConfigError, UnknownTask
from . import _dlq as dlq_cli
from . import _enqueue as enqueue_cli
from . import _monitor as monitor_cli
from . import _status as status_cli
from . import _worker as worker_cli
from ._common import (
    CliError,
    Parser,
    add_log_options,
    app_argument,
    log_options,
    setup_logging,
)
from .bench import _main as bench_cli

#: Exit status: done; failed (unreachable broker, an error of aqw); a usage or set-up error.
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

COMMANDS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "worker": worker_cli.run,
    "enqueue": enqueue_cli.run,
    "status": status_cli.run,
    "monitor": monitor_cli.run,
    "dlq": dlq_cli.run,
    "bench": bench_cli.run,
}


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``aqw`` and its subcommands."""
    parser = Parser(
        prog="aqw",
        description="asyncio job queue worker",
        epilog="exit status: 0 done, 1 failed, 2 usage or configuration error",
    )
    parser.add_argument(
        "--version", action="version", version=f"aqw {__version__}", help="print the version"
    )
    add_log_options(parser, "INFO")
    sub = parser.add_subparsers(dest="command", required=True)
    worker_cli.add_parser(sub)
    enqueue_cli.add_parser(sub)
    status_cli.add_parser(sub)
    monitor_cli.add_parser(sub)
    bench_cli.add_parser(sub)
    dlq_cli.add_parser(sub)
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
        return asyncio.run(COMMANDS[args.command](args))
    except (CliError, ConfigError, UnknownTask) as exc:
        print(f"aqw: error: {printable(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except AqwError as exc:
        print(f"aqw: error: {printable(exc)}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:
        if not isinstance(exc, (ConnectionError, OSError, *CLIENT_ERRORS)):
            raise
        print(f"aqw: error: cannot reach the broker: {printable(exc)}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
