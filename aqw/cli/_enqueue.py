"""``aqw enqueue``: enqueue one job of a task and print its id."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pydantic import ValidationError

from ._common import CliError, add_target, resolve_app


def add_parser(sub: Any) -> None:
    """Add ``aqw enqueue`` to the command line's subparsers."""
    e = sub.add_parser("enqueue", help="enqueue one job")
    add_target(e, positional_app=True)
    e.add_argument("task", help="task name")
    e.add_argument("payload", nargs="?", help="payload as JSON")
    e.add_argument("--key", help="idempotency key")
    e.add_argument("--delay", type=float, help="seconds before the job may run")


async def run(args: argparse.Namespace) -> int:
    """``aqw enqueue APP TASK [PAYLOAD] [--key KEY] [--delay SECONDS]``."""
    app = resolve_app(args)
    try:
        payload = json.loads(args.payload) if args.payload is not None else None
    except json.JSONDecodeError as exc:
        raise CliError(f"payload is not valid JSON: {exc}") from None
    task = app.get_task(args.task)
    try:
        job_id = await task.enqueue(payload, key=args.key, delay=args.delay)
    except ValidationError as exc:
        raise CliError(f"payload does not fit task {args.task!r}: {exc}") from None
    finally:
        await app.close()
    print(job_id)
    return 0
