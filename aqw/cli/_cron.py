"""``aqw cron list [APP]``: the app's periodic tasks, each with its schedule, the last tick
enqueued (the broker's schedule marks, shared on Redis) and the next tick."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from .._text import printable
from ..schedules import schedule_rows
from ..status import render_time
from ._common import CliError, add_log_options, add_target, resolve_app


def add_parser(sub: Any) -> None:
    """Add ``aqw cron list`` to the command line's subparsers."""
    c = sub.add_parser("cron", help="periodic tasks: list their schedules and ticks")
    add_log_options(c)
    csub = c.add_subparsers(dest="cron_command", required=True)
    cl = csub.add_parser("list", help="list the periodic tasks, their last and next ticks")
    add_target(cl, positional_app=True)
    cl.add_argument("--json", action="store_true", help="print JSON for scripts")
    add_log_options(cl)


async def run(args: argparse.Namespace) -> int:
    """``aqw cron list``."""
    if args.cron_command != "list":
        raise CliError(f"unknown cron command {args.cron_command!r}")
    app = resolve_app(args)
    now = time.time()
    try:
        rows = await schedule_rows(app, now)
        # Every worker of the app runs the scheduler (one of them leads): with none
        # running, no tick is enqueued, whatever the next tick says.
        running = bool(rows) and bool(await app.broker.heartbeats())
    finally:
        await app.close()
    if args.json:
        print(json.dumps([{**row, "scheduler_running": running} for row in rows]))
        return 0
    if not rows:
        print("no periodic tasks")
        return 0
    if not running:
        print(
            f"no worker is running on queue {printable(app.queue)}, so no scheduler: "
            "no tick is enqueued until one starts (aqw worker)"
        )
    due = "next tick" if running else "next tick (once a worker runs)"
    for row in rows:
        print(
            f"{printable(row['task'])}  {printable(row['schedule'])}\n"
            f"  last tick: {render_time(row['last_tick'], now)}"
            + (f" (job {printable(row['last_job'])})" if row["last_job"] else "")
            + f"\n  {due}: {render_time(row['next_tick'], now)}"
        )
    return 0
