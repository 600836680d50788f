"""The ``aqw`` command line: ``worker``, ``enqueue``, ``status``, ``monitor``, ``dlq`` and
``bench``.

Settings come from arguments first, then ``AQW_*`` environment variables (``AQW_APP``,
``AQW_BROKER``, ``AQW_QUEUE``, ``AQW_CONCURRENCY``, ``AQW_PREFETCH``, ``AQW_GRACE``,
``AQW_PROCESSES``, ``AQW_LOG_LEVEL``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from .._redis.client import CLIENT_ERRORS
from .._text import printable
from ..errors import AqwError, ConfigError
from . import _dlq as dlq_cli
from . import _enqueue as enqueue_cli
from . import _monitor as monitor_cli
from . import _status as status_cli
from . import _worker as worker_cli
from ._common import CliError, add_log_level, setup_logging
from .bench import _main as bench_cli

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
    parser = argparse.ArgumentParser(prog="aqw", description="asyncio job queue worker")
    add_log_level(parser, "INFO")
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
    setup_logging(args.log_level)
    try:
        if args.command == "worker" and worker_cli.processes(args) > 1:
            # Outside asyncio.run: the supervisor owns the signals of its children.
            return worker_cli.run_processes(args)
        return asyncio.run(COMMANDS[args.command](args))
    except (CliError, ConfigError) as exc:
        print(f"aqw: error: {printable(exc)}", file=sys.stderr)
        return 2
    except AqwError as exc:
        print(f"aqw: error: {printable(exc)}", file=sys.stderr)
        return 1
    except Exception as exc:
        if not isinstance(exc, (ConnectionError, OSError, *CLIENT_ERRORS)):
            raise
        print(f"aqw: error: cannot reach the broker: {printable(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
