"""``aqw limits show|set|reset``: rate limits and per-key caps changed at run time, stored
with the queue (``app.limits``); every running worker honours a change within a second."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .._text import printable
from ..errors import ConfigError
from ._common import CliError, add_log_options, add_target, resolve_app


def add_parser(sub: Any) -> None:
    """Add ``aqw limits`` to the command line's subparsers."""
    c = sub.add_parser("limits", help="rate limits and caps: show them, change them at run time")
    add_log_options(c)
    lsub = c.add_subparsers(dest="limits_command", required=True)
    show = lsub.add_parser("show", help="each task's limits: registered and in force")
    add_target(show, positional_app=False)
    show.add_argument("--json", action="store_true", help="print JSON for scripts")
    change = lsub.add_parser("set", help="change a task's (or one rate key's) limit now")
    add_target(change, positional_app=False)
    change.add_argument("name", metavar="TASK_OR_KEY", help="a task, or TASK:RATE_KEY")
    change.add_argument("rate", nargs="?", help="the new rate, e.g. 50/s (also /min, /h)")
    change.add_argument("--max-per-key", type=int, help="the new per-key cap of the task")
    reset = lsub.add_parser("reset", help="back to the registered limits")
    add_target(reset, positional_app=False)
    reset.add_argument("name", metavar="TASK_OR_KEY", help="a task, or TASK:RATE_KEY")
    for p in (show, change, reset):
        add_log_options(p)


async def run(args: argparse.Namespace) -> int:
    """``aqw limits show|set|reset``."""
    app = resolve_app(args)
    try:
        if args.limits_command == "set":
            await app.limits.set(args.name, args.rate, max_per_key=args.max_per_key)
        elif args.limits_command == "reset":
            await app.limits.reset(args.name)
        rows = await app.limits.show()
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    finally:
        await app.close()
    if getattr(args, "json", False):
        print(json.dumps(rows))
        return 0
    if not rows:
        print("no task of the app has a rate limit or a per-key cap")
        return 0
    for row in rows:
        changed = "" if row["now"] == row["registered"] else f" (registered {row['registered']})"
        print(f"{printable(row['name'])}  {row['kind']} {row['now']}{changed}")
    return 0
