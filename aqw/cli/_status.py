"""``aqw status``: the screen of ``aqw.status``, once, as JSON, or refreshed every few seconds
until Ctrl-C; or one job's whole record (``aqw status JOB_ID``, the same as ``aqw job show``:
exit status 6 when there is no record of it)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from typing import Any

from ..app import App
from ..status import gather_status, render
from . import _job as job_cli
from ._common import (
    StopSignals,
    add_log_options,
    add_target,
    number,
    resolve_app,
    take_app,
    target_options,
)


def add_parser(sub: Any) -> None:
    """Add ``aqw status`` to the command line's subparsers."""
    p = sub.add_parser(
        "status",
        help="queue depth, rates, workers, alerts; or one job's record",
        description="One screen on a queue, or one job's whole record (as aqw job show; "
        "exit status 6 when there is none). The first argument is the app when it looks "
        "like package.module:app (or when two are given).",
    )
    p.add_argument(
        "first", nargs="?", metavar="APP", help="the app, as package.module:app (or --app, AQW_APP)"
    )
    p.add_argument("job_id", nargs="?", metavar="JOB_ID", help="show this job's record")
    add_target(p, positional_app=False)
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument(
        "--watch",
        type=number(0, above=True),
        metavar="SECONDS",
        help="refresh every SECONDS (> 0) until Ctrl-C",
    )
    add_log_options(p)


def job_argument(args: argparse.Namespace) -> str | None:
    """``[APP] [JOB_ID]``: the job id, if any, the app set in ``args.app``."""
    given = [w for w in (getattr(args, "first", None), getattr(args, "job_id", None)) if w]
    rest = take_app(args, given, first_is_app=len(given) == 2)
    return rest[0] if rest else None


async def run(args: argparse.Namespace) -> int:
    """``aqw status [APP] [JOB_ID] [--json] [--watch SECONDS]``."""
    job_id = job_argument(args)
    app = resolve_app(args, need_app=False)
    release = target_options(args).strip() or "--app ..."  # for `aqw job release` hints
    try:
        if job_id:
            return await job_cli.show(app, job_id, as_json=args.json, target=target_options(args))
        if getattr(args, "watch", None) is None:
            _show(await gather_status(app, release), args.json, clear=False)
            return 0
        return await _watch(app, float(args.watch), args.json, release)
    finally:
        await app.close()


def _show(status: dict[str, Any], as_json: bool, clear: bool) -> None:
    # ensure_ascii: every control character (ESC included) is written as a \uXXXX escape.
    text = json.dumps(status, indent=2, ensure_ascii=True) + "\n" if as_json else render(status)
    sys.stdout.write(("\x1b[2J\x1b[H" if clear else "") + text)
    sys.stdout.flush()


async def _watch(app: App, every: float, as_json: bool, release: str) -> int:
    """Refresh every ``every`` seconds until Ctrl-C (SIGINT, exit status 130) or SIGTERM."""
    stop = asyncio.Event()
    clear = not as_json and sys.stdout.isatty()
    with StopSignals(stop.set) as signals:
        while not stop.is_set():
            # Clear the screen of a terminal; a pipe gets the screens one after the other.
            _show(await gather_status(app, release), as_json, clear=clear)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(every, 0.1)):
                    await stop.wait()
    return signals.status
