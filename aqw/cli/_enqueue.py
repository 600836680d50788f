"""``aqw enqueue``: enqueue one job of a task and print its id."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pydantic import ValidationError

from ..errors import UnknownTask
from ._common import (
    CliError,
    add_log_options,
    add_target,
    integer,
    number,
    resolve_app,
    take_app,
    validation_error,
)


def add_parser(sub: Any) -> None:
    """Add ``aqw enqueue`` to the command line's subparsers."""
    e = sub.add_parser(
        "enqueue",
        help="enqueue one job",
        description="Enqueue one job and print its id. The first argument is the app when it "
        "looks like package.module:app (or when three are given); else the app comes from "
        "--app or AQW_APP.",
    )
    e.add_argument(
        "first", nargs="?", metavar="APP", help="the app, as package.module:app (or --app, AQW_APP)"
    )
    e.add_argument("task", metavar="TASK", help="task name")
    e.add_argument("payload", nargs="?", metavar="PAYLOAD", help="payload as JSON")
    add_target(e, positional_app=False)
    e.add_argument("--key", help="idempotency key")
    e.add_argument(
        "--delay", type=number(0), metavar="SECONDS", help="seconds before the job may run, >= 0"
    )
    e.add_argument(
        "--priority", type=integer(0), metavar="N", help="priority level 0-9, higher runs first"
    )
    add_log_options(e)


def task_and_payload(args: argparse.Namespace) -> tuple[str, str | None]:
    """``[APP] TASK [PAYLOAD]``: the task and the payload, the app set in ``args.app``."""
    words = [args.first, args.task, args.payload]
    given = [w for w in words if w is not None]
    rest = take_app(args, given, first_is_app=len(given) == 3)
    if not rest:
        raise CliError("name the task: aqw enqueue [APP] TASK [PAYLOAD]")
    return rest[0], (rest[1] if len(rest) > 1 else None)


async def run(args: argparse.Namespace) -> int:
    """``aqw enqueue [APP] TASK [PAYLOAD] [--key KEY] [--delay SECONDS] [--priority N]``."""
    task_name, raw = task_and_payload(args)
    app = resolve_app(args)
    try:
        try:
            payload = json.loads(raw) if raw is not None else None
        except json.JSONDecodeError as exc:
            raise CliError(f"payload is not valid JSON: {exc}") from None
        try:
            task = app.get_task(task_name)
        except UnknownTask as exc:
            raise CliError(str(exc)) from None
        try:
            job_id = await task.enqueue(
                payload,
                key=args.key,
                delay=args.delay,
                priority=args.priority,
            )
        except ValidationError as exc:
            raise payload_error(task_name, raw, exc) from None
    finally:
        await app.close()
    print(job_id)
    if job_id.duplicate:
        print(
            f"note: a job with key {args.key!r} was enqueued before: nothing new was "
            "enqueued, this is that job's id",
            file=sys.stderr,
        )
    return 0


def payload_error(task_name: str, raw: str | None, exc: ValidationError) -> CliError:
    """The error of a payload that does not fit: pydantic's lines (``validation_error``),
    or "no payload given" when there was none."""
    if raw is None:
        return CliError(
            f"payload does not fit task {task_name!r}: no payload given "
            f"(aqw enqueue [APP] {task_name} PAYLOAD, the payload as JSON)"
        )
    return validation_error(f"payload does not fit task {task_name!r}", exc)
