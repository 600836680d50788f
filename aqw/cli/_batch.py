"""``aqw batch show|cancel ID`` and ``aqw flow show ID``: a batch's counts and callbacks, its
cancellation, and a flow's steps, from the command line (``docs/concepts/workflows.md``).
Everything printed from the broker is escaped (``aqw._text.printable``, ``ensure_ascii``
JSON). Exit status, besides 0 (done), 1 (failed) and 2 (usage): 6 when there is no such
batch or flow (unknown id, or expired)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from .._text import printable
from ..app import App
from ..brokers.batching import BatchInfo
from ._common import CliError, add_log_options, add_target, resolve_app, take_app
from ._job import EXIT_UNKNOWN_JOB

APP_HELP = "the app, as package.module:app (or --app, AQW_APP)"


def add_parser(sub: Any) -> None:
    """Add ``aqw batch show|cancel`` and ``aqw flow show``; each takes ``[APP] ID``."""
    b = sub.add_parser(
        "batch",
        help="one batch: show its counts and callbacks, cancel it",
        description="One batch by its id. Exit status: 0 done, 1 failed, 2 usage, 6 no such batch.",
    )
    add_log_options(b)
    bsub = b.add_subparsers(dest="batch_command", required=True)
    show = bsub.add_parser("show", help="the batch's state, counts and callbacks")
    cancel = bsub.add_parser(
        "cancel", help="cancel the batch's children not started, stop the running ones, seal it"
    )
    f = sub.add_parser(
        "flow",
        help="one flow: show its steps",
        description="One flow by its id. Exit status: 0 done, 1 failed, 2 usage, 6 no such flow.",
    )
    add_log_options(f)
    fsub = f.add_subparsers(dest="flow_command", required=True)
    flow_show = fsub.add_parser("show", help="the flow's state and each step's")
    for p in (show, cancel, flow_show):
        p.add_argument("first", nargs="?", metavar="APP", help=APP_HELP)
        p.add_argument("ident", metavar="ID", help="the batch's or flow's id")
        add_target(p, positional_app=False)
        add_log_options(p)
        p.add_argument("--json", action="store_true", help="print it as JSON for scripts")


def _ident(args: argparse.Namespace) -> str:
    given = [w for w in (args.first, args.ident) if w is not None]
    rest = take_app(args, given, first_is_app=len(given) == 2)
    if not rest:
        raise CliError("name the batch or flow: ID after the app")
    return str(rest[0])


def render_batch(info: BatchInfo) -> str:
    """A batch for people: its state, a progress line and its callbacks."""
    lines = [
        f"batch {printable(info.id)}: {info.state}",
        f"  {info.done}/{info.total} done: {info.succeeded} succeeded, {info.failed} failed, "
        f"{info.cancelled} cancelled, {info.expired} expired; {info.pending} pending",
    ]
    if info.parent:
        lines.append(f"  in batch {printable(info.parent)}")
    for kind, job_id in info.callbacks.items():
        lines.append(f"  on_{kind}: job {printable(job_id)} (aqw job show {printable(job_id)})")
    return "\n".join(lines) + "\n"


async def run(args: argparse.Namespace) -> int:
    """``aqw batch show|cancel [APP] ID``, ``aqw flow show [APP] ID``."""
    ident = _ident(args)
    app = resolve_app(args, need_app=False)
    try:
        if args.command == "flow":
            return await flow_show(app, ident, as_json=args.json)
        if args.batch_command == "cancel":
            info = await app.cancel_batch(ident)
        else:
            info = await app.batch_info(ident)
        if info is None:
            print(f"no batch {printable(ident)} on queue {printable(app.queue)}")
            return EXIT_UNKNOWN_JOB
        if args.json:
            fields = dataclasses.asdict(info)
            fields.pop("data", None)
            print(json.dumps(fields, ensure_ascii=True, sort_keys=True))
        else:
            print(render_batch(info), end="")
        return 0
    finally:
        await app.close()


async def flow_show(app: App, flow_id: str, *, as_json: bool) -> int:
    """Print the flow's state and each step's (``aqw flow show``)."""
    info = await app.flow_info(flow_id)
    if info is None:
        print(f"no flow {printable(flow_id)} on queue {printable(app.queue)}")
        return EXIT_UNKNOWN_JOB
    if as_json:
        steps = {
            n: {"job_id": s.job_id, "task": s.task, "after": list(s.after), "state": s.state}
            for n, s in info.steps.items()
        }
        print(json.dumps({"id": info.id, "state": info.state, "steps": steps}, ensure_ascii=True))
        return 0
    print(f"flow {printable(info.id)}: {info.state} ({info.batch.done}/{info.batch.total} steps)")
    for s in info.steps.values():
        after = f" after {', '.join(printable(a) for a in s.after)}" if s.after else ""
        what = "job" if s.batch is None else f"batch of {s.batch.total}"
        print(f"  {printable(s.name)}: {s.state} ({what} {printable(s.job_id)}){after}")
    return 0
