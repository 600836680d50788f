"""``aqw dlq list|show|replay|purge``: the dead-letter queue from the command line. Everything
printed came from the broker and is escaped, so no stored terminal escape reaches the screen.

``show`` takes an entry id or a job id: a job's record names its entry (``dlq_entry``); when
the record is gone, the first ``SCAN_LIMIT`` entries are searched for the job id."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from .._text import plural, printable
from ..app import App
from ..brokers.base import DeadJob
from ..dlq import DeadLetters, dead_job_json
from ..errors import ConfigError
from ..status import render_time
from ._common import (
    CliError,
    add_log_options,
    add_target,
    integer,
    number,
    resolve_app,
    take_app,
    target_options,
    validation_error,
)

APP_HELP = "the app, as package.module:app (or --app, AQW_APP)"

#: How many DLQ entries ``aqw dlq show JOB_ID`` searches for the job id when its record is gone.
SCAN_LIMIT = 10_000


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
    ds = dsub.add_parser("show", help="show one dead job, by its entry id or its job id")
    ds.add_argument("first", nargs="?", metavar="APP", help=APP_HELP)
    ds.add_argument("id", metavar="ID", help="the dead job's entry id, or its job id")
    add_target(ds, positional_app=False)
    ds.add_argument("--json", action="store_true", help="print JSON for scripts")
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
        rest = take_app(args, given, first_is_app=len(given) == 2)
        if not rest:  # the one argument was the app
            raise CliError("show: name the dead job: its entry id or job id after the app")
        args.id = rest[0]
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
            dead = await find_dead(app, args.id)
            if args.json:
                print(dead_job_json(dead))
            else:
                sys.stdout.write(render_dead(dead, target_options(args)))
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
                raise validation_error("--edit-payload does not fit the task", exc) from None
            print(f"\nreplayed {plural(n, 'job')}", file=sys.stderr)
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
    print(
        f"{'ID':<20} {'JOB':<32} {'TASK':<24} {'ERROR':<20} {'ATT':>3} {'FAILED AT':<19}  MESSAGE"
    )
    for d in items:
        # Everything here came from the broker: escaped, so no terminal escape passes.
        when = _when(d.last_failed_at)
        message = printable(d.error.replace("\n", " "))[:60]
        task = printable(d.task) if d.task else "(undecodable)"
        job = printable(d.job_id) if d.job_id else "-"
        print(
            f"{printable(d.id):<20} {job:<32} {task:<24.24} {printable(d.error_type):<20.20} "
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


async def find_dead(app: App, wanted: str) -> DeadJob:
    """The dead job ``wanted`` names: a DLQ entry id, else a job id (the entry its record
    names; with no record, the newest of the first ``SCAN_LIMIT`` entries of that job). A
    ``CliError`` saying where it looked when there is none. Notes go to stderr."""
    dead = await app.dlq.get(wanted)
    if dead is not None:
        return dead
    missing = f"no dead job with id {wanted!r}"
    try:
        info = await app.job(wanted)
    except ConfigError:  # not a possible job id either
        raise CliError(missing) from None
    if info is not None:
        if info.dlq_entry is None:
            raise CliError(f"{missing}: job {wanted!r} is {info.state}, not dead-lettered")
        dead = await app.dlq.get(info.dlq_entry)
        if dead is None:
            raise CliError(
                f"{missing}: job {wanted!r} was dead-lettered as entry {info.dlq_entry!r}, "
                "which is gone (replayed or purged)"
            )
        return dead
    seen = 0
    found: DeadJob | None = None
    async for entry in app.dlq.iterate():
        if entry.job_id == wanted:
            found = entry  # oldest first: the last one seen is the newest
        seen += 1
        if seen >= SCAN_LIMIT:
            break
    if found is not None:
        print(
            f"note: no record of job {printable(wanted)} (expired?); found its entry "
            f"{printable(found.id)} by searching the dead-letter queue",
            file=sys.stderr,
        )
        return found
    if seen >= SCAN_LIMIT:
        raise CliError(
            f"{missing}: no entry, no record of a job {wanted!r}, and none of the first "
            f"{SCAN_LIMIT} dead jobs has that job id (the rest were not searched)"
        )
    raise CliError(f"{missing}: no entry, no record of a job {wanted!r}, and no dead job of it")


def render_dead(dead: DeadJob, target: str = "") -> str:
    """A dead job for people: its fields, times as dates, the traceback as lines, the job's
    envelope as indented JSON once, the damage found in the entry. Everything escaped.
    ``target``: the options the replay command needs (``target_options``)."""
    now = time.time()
    task = printable(dead.task) if dead.task else "(undecodable)"
    rows = [
        ("job", printable(dead.job_id)),
        ("task", task),
        ("error type", printable(dead.error_type)),
        ("error", printable(dead.error)),
        ("attempts", str(dead.attempts)),
        ("first failed", render_time(dead.first_failed_at or None, now)),
        ("last failed", render_time(dead.last_failed_at or None, now)),
        ("worker", printable(dead.worker)),
        ("replay", f"aqw dlq replay {printable(dead.id)}{printable(target)}"),
    ]
    lines = [f"dead job {printable(dead.id)}"]
    lines += [f"  ! damaged entry: {printable(note)}" for note in dead.damaged]
    lines += [f"  {name:<13} {value or '-'}" for name, value in rows]
    if dead.traceback:
        tb = printable(dead.traceback.rstrip("\n"), keep_newlines=True)
        lines += ["  traceback:", *(f"    {line}" for line in tb.split("\n"))]
    job = dead.job
    if job is not None:
        envelope = json.dumps(json.loads(job.model_dump_json()), indent=2, ensure_ascii=False)
        lines.append("  envelope:")
    else:
        envelope = dead.data.decode("utf-8", "replace")
        lines.append("  envelope (not a valid job, as stored):")
    lines += [f"    {line}" for line in printable(envelope, keep_newlines=True).split("\n")]
    return "\n".join(lines) + "\n"


async def _require_ids(dlq: DeadLetters, ids: Sequence[str]) -> None:
    missing = [i for i in ids if await dlq.get(i) is None]
    if missing:
        raise CliError(f"no dead job with id {', '.join(repr(i) for i in missing)}")


def _progress(done: int, total: int) -> None:
    width = 30
    filled = int(width * done / total) if total else width
    bar = "#" * filled + "-" * (width - filled)
    print(f"\r[{bar}] {done}/{total}", end="", file=sys.stderr, flush=True)
