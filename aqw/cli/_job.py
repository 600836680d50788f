"""``aqw job show|wait|cancel|release``: one job's record from the command line, waiting for
its end, cancelling it, clearing a lease key no live worker holds (``release``: damaged state,
the broker's ``server`` part). Everything printed from the broker is escaped
(``aqw._text.printable``, ``ensure_ascii`` JSON), so no stored terminal escape reaches the
screen.

Exit status, besides 0 (done), 1 (failed, e.g. the broker unreachable) and 2 (usage):
``wait`` exits 3 when the job failed or is dead, 4 cancelled, 5 expired and 124 when
``--timeout`` passed first (as ``timeout(1)`` does); every command exits 6 when there is no
record of the job (``aqw.UnknownJob``: never enqueued on this queue, or its record expired);
``release`` exits 1 when a live worker holds the lease (nothing is deleted).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .._text import printable
from ..app import App
from ..brokers.messages import Release
from ..errors import UnknownJob
from ..record import JobInfo
from ..status import render_job
from ._common import (
    CliError,
    add_log_options,
    add_target,
    error_line,
    number,
    resolve_app,
    take_app,
    target_options,
)

#: Exit status of ``aqw job wait`` by the job's final state (succeeded: 0).
EXIT_BY_STATE = {"succeeded": 0, "failed": 3, "dead": 3, "cancelled": 4, "expired": 5}
#: No record of the job (any command); ``aqw job wait --timeout`` passed first.
EXIT_UNKNOWN_JOB, EXIT_TIMEOUT = 6, 124

APP_HELP = "the app, as package.module:app (or --app, AQW_APP)"

#: What ``aqw job cancel`` says for each outcome of ``app.cancel`` (``cancelling`` is
#: ``stopping_line``'s).
CANCELLED = {"cancelled": "cancelled: it had not started and will not run"}


def stopping_line(app: App, task: str) -> str:
    """What ``aqw job cancel`` says of a running job of ``task``: when its handler stops."""
    known = app.tasks.get(task)
    renewal = f"within ttl/3 = {(known.options.lease_ttl if known else app.lease_ttl) / 3:g}s"
    if app.broker.pushes_cancels:
        return (
            "cancelling: its worker is told now and stops the handler within about a second "
            f"(at its next lease renewal, {renewal}, if the word does not reach it)"
        )
    return f"cancelling: its handler is stopped at its next lease renewal ({renewal})"


def add_parser(sub: Any) -> None:
    """Add ``aqw job`` and its four commands to the command line's subparsers. Each takes
    ``[APP] JOB_ID``: the app as a first argument, ``--app`` or ``AQW_APP``, or a bare
    ``--broker``."""
    j = sub.add_parser(
        "job",
        help="one job: show its record, wait for its end, cancel it, release its lease",
        description="One job by its id. Exit status: 0 done, 1 failed, 2 usage, 3 the job "
        "failed or is dead, 4 cancelled, 5 expired (wait), 6 no record of the job, "
        "124 wait --timeout passed.",
    )
    add_log_options(j)
    jsub = j.add_subparsers(dest="job_command", required=True)
    show = jsub.add_parser("show", help="the job's whole record")
    wait = jsub.add_parser(
        "wait",
        help="wait for the job to end; exit 0 succeeded, 3 failed or dead, 4 cancelled, "
        "5 expired, 6 unknown, 124 timed out",
    )
    cancel = jsub.add_parser("cancel", help="cancel the job (it never runs, or its handler stops)")
    release = jsub.add_parser(
        "release",
        help="delete the job's lease key when no live worker holds it (a key left or forged "
        "by someone else blocks the job: aqw status names it); refused, exit 1, while a "
        "worker runs the job",
    )
    for p in (show, wait, cancel, release):
        p.add_argument("first", nargs="?", metavar="APP", help=APP_HELP)
        p.add_argument("job_id", metavar="JOB_ID", help="the job's id (as enqueue printed it)")
        add_target(p, positional_app=False)
        add_log_options(p)
    show.add_argument("--json", action="store_true", help="print the record as JSON for scripts")
    wait.add_argument(
        "--timeout",
        type=number(0, above=True),
        metavar="SECONDS",
        help="give up after SECONDS (> 0), exit status 124 (default: wait for ever)",
    )
    wait.add_argument("--json", action="store_true", help="print the final record as JSON")


def job_argument(args: argparse.Namespace) -> str:
    """``[APP] JOB_ID``: the job id, the app (when given) set in ``args.app``."""
    given = [w for w in (args.first, args.job_id) if w is not None]
    rest = take_app(args, given, first_is_app=len(given) == 2)
    if not rest:  # the one argument was the app
        raise CliError("name the job: JOB_ID after the app")
    return rest[0]


async def run(args: argparse.Namespace) -> int:
    """``aqw job show|wait|cancel [APP] JOB_ID``."""
    job_id = job_argument(args)
    app = resolve_app(args, need_app=False)
    try:
        if args.job_command == "show":
            return await show(app, job_id, as_json=args.json, target=target_options(args))
        if args.job_command == "wait":
            target = target_options(args)
            return await wait(app, job_id, args.timeout, as_json=args.json, target=target)
        if args.job_command == "release":
            return await release(app, job_id)
        return await cancel(app, job_id)
    finally:
        await app.close()


async def show(app: App, job_id: str, *, as_json: bool, target: str = "") -> int:
    """Print the job's record (``aqw job show``, ``aqw status JOB_ID``); no record of it
    raises ``UnknownJob`` (exit status 6). ``target``: the options the hints' commands
    need (``target_options``)."""
    info = await app.job(job_id)
    if info is None:
        raise UnknownJob(job_id, app.broker.queue)
    if as_json:
        print(record_json(info))
    else:
        sys.stdout.write(render_job(job_id, info, target=target))
    return 0


async def wait(
    app: App, job_id: str, timeout: float | None, *, as_json: bool, target: str = ""
) -> int:
    """Wait for the job to end, print how it ended; the exit status says how (see
    ``EXIT_BY_STATE``), 124 when ``timeout`` passed first."""
    try:
        info = await app.jobs.wait(job_id, timeout)
    except TimeoutError:
        if timeout is None:  # not the wait's own deadline
            raise
        now = await app.job(job_id)
        state = f" (it is {now.state})" if now is not None else ""
        said = f"job {printable(job_id)} has not ended after {timeout:g}s{state}"
        error_line(said)
        return EXIT_TIMEOUT
    if as_json:
        print(record_json(info))
    else:
        print(final_line(info, target))
        if info.state == "succeeded" and info.has_result:
            print(json.dumps(info.result, indent=2, ensure_ascii=True))
    return EXIT_BY_STATE.get(info.state, 1)


async def cancel(app: App, job_id: str) -> int:
    """Cancel the job and say what happened, in one line."""
    outcome = await app.cancel(job_id)
    if outcome == "unknown":
        raise UnknownJob(job_id, app.broker.queue)
    if outcome == "finished":
        info = await app.job(job_id)
        state = info.state if info is not None else "and its record is gone"
        print(f"already finished ({state}); nothing to cancel")
    elif outcome == "cancelling":
        info = await app.job(job_id)
        print(stopping_line(app, info.task if info is not None else ""))
    else:
        print(CANCELLED[outcome])
    return 0


async def release(app: App, job_id: str) -> int:
    """``aqw job release``: delete the job's lease key if it still holds the token read, and
    no live worker holds it (its record reads running with a lease expiry ahead)."""
    server = app.broker.server  # None: job leases live in the worker process (memory, SQS)
    done = await server.release_lease(job_id) if server is not None else Release("unsupported")
    token = printable(done.token.decode("utf-8", "replace"))[:80]
    job = printable(job_id)
    if done.outcome == "released":
        print(
            f"job {job}: released its lease key (token {token!r}); the job runs again once a "
            "worker reclaims its delivery (within its lease_ttl)"
        )
        return 0
    if done.outcome == "no lease":
        print(f"job {job}: no lease key: nothing to release")
        return 0
    if done.outcome == "held":
        error_line(
            f"job {job}: not released: worker {printable(done.worker)} holds its lease "
            f"(expiring in {done.expires_in:.0f} s, renewed while the job runs)"
        )
    elif done.outcome == "changed":
        error_line(
            f"job {job}: not released: its lease key changed while it was read (another "
            "holder took it); run aqw status again"
        )
    else:
        error_line(
            f"job {job}: the {app.broker.system} broker keeps job leases in the worker "
            "process: there is no lease key to release"
        )
    return 1


def final_line(info: JobInfo, target: str = "") -> str:
    """How a finished job ended, in one line (``aqw job wait``); ``target``: the options
    its hint's command needs."""
    line = f"job {printable(info.id)}: {info.state}"
    if info.state == "succeeded" and info.result_note:
        line += f"; its result was not kept: {printable(info.result_note)}"
    elif info.state in ("failed", "dead"):
        error = info.error
        if error is None:
            line += ": no error recorded"
        else:
            said = error.message if error.message.startswith(error.type) else ""
            line += f": {printable(said or f'{error.type}: {error.message}')}"
        if info.dlq_entry:
            entry = printable(info.dlq_entry)
            line += f" (dlq entry {entry}: aqw dlq show {entry}{printable(target)})"
    return line


def record_json(info: JobInfo) -> str:
    """The record as indented JSON; ``ensure_ascii`` writes every control character as a
    ``\\uXXXX`` escape."""
    return json.dumps(info.model_dump(mode="json"), indent=2, ensure_ascii=True)
