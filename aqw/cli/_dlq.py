"""``aqw dlq list|show|replay|purge``: the dead-letter queue from the command line. Everything
printed came from the broker and is escaped, so no stored terminal escape reaches the screen."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from .._text import printable
from ..dlq import DeadLetters, dead_job_json
from ._common import (
    CliError,
    add_log_options,
    add_target,
    integer,
    number,
    resolve_app,
    take_app,
)

APP_HELP = "the app, as package.module:app (or --app, AQW_APP)"


def add_parser(sub: Any) -> None:
    """Add ``aqw dlq`` and its four commands to the command line's subparsers. Each takes
    the app as ``--app``, ``AQW_APP`` or a first argument that looks like package.module:app."""
    d = sub.add_parser("dlq", help="dead-letter queue: list, show, replay, purge")
    add_log_options(d)
    dsub = d.add_subparsers(dest="dlq_command", required=True)
    dl = dsub.add_parser("list", help="list dead jobs")
    add_target(dl, positional_app=True)
    dl.add_argument("--task", help="only dead jobs of this task")
    dl.add_argument("--error-type", help="only dead jobs that failed with this exception type")
    dl.add_argument(
        "--limit", type=integer(1), default=100, metavar="N", help="show at most N, >= 1 (100)"
    )
    dl.add_argument("--json", action="store_true", help="print JSON for scripts")
    ds = dsub.add_parser("show", help="show one dead job")
    ds.add_argument("first", nargs="?", metavar="APP", help=APP_HELP)
    ds.add_argument("id", metavar="ID", help="the dead job's entry id")
    add_target(ds, positional_app=False)
    dr = dsub.add_parser("replay", help="put dead jobs back on the queue")
    dr.add_argument("first", nargs="?", metavar="APP", help=APP_HELP)
    dr.add_argument("ids", nargs="*", metavar="ID", help="entry ids to replay")
    add_target(dr, positional_app=False)
    dr.add_argument("--all", action="store_true", help="replay every dead job")
    dr.add_argument("--task", help="replay the dead jobs of this task")
    dr.add_argument("--edit-payload", metavar="JSON", help="replace the payload with this JSON")
    dp = dsub.add_parser("purge", help="delete dead jobs")
    dp.add_argument("first", nargs="?", metavar="APP", help=APP_HELP)
    dp.add_argument("ids", nargs="*", metavar="ID", help="entry ids to delete")
    add_target(dp, positional_app=False)
    dp.add_argument(
        "--older-than",
        type=number(0),
        metavar="SECONDS",
        help="only jobs that failed this many seconds ago or more, >= 0",
    )
    dp.add_argument("--task", help="only dead jobs of this task")
    dp.add_argument("--all", action="store_true", help="every dead job")
    for p in (dl, ds, dr, dp):
        add_log_options(p)


def _positionals(args: argparse.Namespace) -> None:
    """``[APP] ID`` (show) and ``[APP] [ID...]`` (replay, purge): the app to ``args.app``."""
    if args.dlq_command == "show":
        given = [w for w in (args.first, args.id) if w is not None]
        args.id = take_app(args, given, first_is_app=len(given) == 2)[0]
    elif args.dlq_command in ("replay", "purge"):
        args.ids = take_app(args, [args.first, *args.ids])


async def run(args: argparse.Namespace) -> int:
    """``aqw dlq list|show|replay|purge``."""
    _positionals(args)
    app = resolve_app(args, need_app=False)
    dlq = app.dlq
    try:
        if args.dlq_command == "list":
            return await _list(dlq, args)
        if args.dlq_command == "show":
            dead = await dlq.get(args.id)
            if dead is None:
                raise CliError(f"no dead job with id {args.id!r}")
            print(dead_job_json(dead))
            return 0
        if args.dlq_command == "replay":
            if not (args.ids or args.all or args.task):
                raise CliError("replay: give entry IDs, --all or --task TASK")
            try:
                edit = json.loads(args.edit_payload) if args.edit_payload else None
            except json.JSONDecodeError as exc:
                raise CliError(f"--edit-payload is not valid JSON: {exc}") from None
            if edit is not None and not app.tasks:
                raise CliError("--edit-payload needs the app (--app MODULE:APP) to validate it")
            await _require_ids(dlq, args.ids)
            try:
                n = await dlq.replay(
                    args.ids, all=args.all, task=args.task, edit_payload=edit, progress=_progress
                )
            except ValidationError as exc:
                raise CliError(f"--edit-payload does not fit the task: {exc}") from None
            print(f"\nreplayed {n} jobs", file=sys.stderr)
            print(n)
            return 0
        if args.dlq_command == "purge":
            if args.older_than is None and not args.ids and not args.task and not args.all:
                raise CliError("purge: give entry IDs, --older-than SECONDS, --task or --all")
            older = 0.0 if args.all and args.older_than is None else args.older_than
            await _require_ids(dlq, args.ids)
            n = await dlq.purge(older_than=older, ids=args.ids, task=args.task)
            print(n)
            return 0
    finally:
        await app.close()
    raise CliError(f"unknown dlq command {args.dlq_command!r}")


async def _list(dlq: DeadLetters, args: argparse.Namespace) -> int:
    items = await dlq.list(task=args.task, error_type=args.error_type, limit=args.limit)
    if args.json:
        # ensure_ascii: control characters (ESC...) are written as \uXXXX escapes
        print(json.dumps([d.as_dict() for d in items], indent=2, ensure_ascii=True))
        return 0
    if not items:
        filtered = args.task is not None or args.error_type is not None
        print("no dead job matches" if filtered else "the dead-letter queue is empty")
        return 0
    print(f"{'ID':<20} {'TASK':<24} {'ERROR':<20} {'ATT':>3} {'FAILED AT':<19}  MESSAGE")
    for d in items:
        # Everything here came from the broker: escaped, so no terminal escape passes.
        when = _when(d.last_failed_at)
        message = printable(d.error.replace("\n", " "))[:60]
        task = printable(d.task) if d.task else "(undecodable)"
        print(
            f"{printable(d.id):<20} {task:<24.24} {printable(d.error_type):<20.20} "
            f"{d.attempts:>3} {when}  {message}"
        )
        for note in d.damaged:
            print(f"{'':<20} ! damaged entry: {printable(note)}")
    return 0


def _when(at: float) -> str:
    """A failure time as local date and time (``?`` when unknown or not a plausible time)."""
    if at <= 0:
        return f"{'?':<19}"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    except (OverflowError, OSError, ValueError):
        return f"{'?':<19}"


async def _require_ids(dlq: DeadLetters, ids: Sequence[str]) -> None:
    missing = [i for i in ids if await dlq.get(i) is None]
    if missing:
        raise CliError(f"no dead job with id {', '.join(repr(i) for i in missing)}")


def _progress(done: int, total: int) -> None:
    width = 30
    filled = int(width * done / total) if total else width
    bar = "#" * filled + "-" * (width - filled)
    print(f"\r[{bar}] {done}/{total}", end="", file=sys.stderr, flush=True)
