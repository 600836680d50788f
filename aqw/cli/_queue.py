"""``aqw queue pause|resume|status|promote|delete``: a queue's operator controls from the
command line (the broker's ``control`` part). A paused queue keeps its jobs and takes new
ones; its workers fetch nothing until it is resumed (they read the flag about once a
second). ``promote`` runs a delayed job now; ``delete`` removes a waiting job no worker has
taken (its record says cancelled). Exit status: 0 done, 1 failed (the broker has no such
control, or nothing was found to act on), 2 usage.
"""

from __future__ import annotations

import argparse
from typing import Any

from .._text import printable
from ..app import App
from ..brokers.parts import QueueControl
from ..job import Job
from ._common import CliError, add_log_options, add_target, error_line, resolve_app

QUEUE_HELP = "the queue (default: --queue, AQW_QUEUE or the app's)"


def add_parser(sub: Any) -> None:
    """Add ``aqw queue`` and its commands to the command line's subparsers."""
    q = sub.add_parser(
        "queue",
        help="pause or resume a queue, show whether it is paused, run a delayed job now, "
        "delete a waiting job",
        description="A queue's controls. Exit status: 0 done, 1 failed or nothing found, 2 usage.",
    )
    add_log_options(q)
    qsub = q.add_subparsers(dest="queue_command", required=True)
    pause = qsub.add_parser("pause", help="workers stop fetching from the queue (within ~1 s)")
    resume = qsub.add_parser("resume", help="workers fetch from the queue again")
    status = qsub.add_parser("status", help="paused or not, and the jobs waiting per priority")
    promote = qsub.add_parser("promote", help="run a delayed (or retrying) job now")
    delete = qsub.add_parser("delete", help="delete a waiting job that no worker has taken")
    for p in (pause, resume, status):
        p.add_argument("name", nargs="?", metavar="NAME", help=QUEUE_HELP)
    promote.add_argument("job_id", metavar="JOB_ID", help="the delayed job's id")
    delete.add_argument("job_id", metavar="JOB_ID", help="the waiting job's id")
    for p in (pause, resume, status, promote, delete):
        add_target(p, positional_app=False)
        add_log_options(p)


def _control(app: App) -> QueueControl:
    control = app.broker.control
    if control is None:
        raise CliError(f"the {app.broker.system} broker has no queue controls (pause, promote)")
    return control


async def run(args: argparse.Namespace) -> int:
    """``aqw queue ...``."""
    if getattr(args, "name", None):
        args.queue = args.name
    app = resolve_app(args, need_app=False)
    try:
        control = _control(app)
        queue = printable(app.broker.queue)
        command = args.queue_command
        if command == "pause":
            done = await control.pause()
            print(f"queue {queue}: paused" + ("" if done else " (it was paused already)"))
            return 0
        if command == "resume":
            done = await control.resume()
            print(f"queue {queue}: resumed" + ("" if done else " (it was not paused)"))
            return 0
        if command == "status":
            return await status(app, control)
        if command == "promote":
            return await promote(app, control, args.job_id)
        return await delete(app, control, args.job_id)
    finally:
        await app.close()


async def status(app: App, control: QueueControl) -> int:
    paused = await control.paused()
    counts = await control.waiting_counts()
    depth = await app.broker.depth()
    state = "paused (workers fetch nothing)" if paused else "running"
    levels = ", ".join(f"priority {lv}: {n}" for lv, n in sorted(counts.items(), reverse=True))
    print(f"queue {printable(app.broker.queue)}: {state}")
    print(f"  {depth.waiting} waiting ({levels}), {depth.in_flight} running, ", end="")
    print(f"{depth.delayed} delayed, {depth.dead} dead")
    return 0


async def promote(app: App, control: QueueControl, job_id: str) -> int:
    if await control.promote(job_id):
        print(f"job {printable(job_id)}: due now; a worker runs it on its next pass")
        return 0
    error_line(f"job {printable(job_id)}: no delayed job has this id on this queue")
    return 1


async def delete(app: App, control: QueueControl, job_id: str) -> int:
    """Find the job among the waiting ones (each level's first ``SCAN``), cancel its record
    (so that it never runs, should a worker take it meanwhile), delete its entry."""
    found = await find_waiting(control, job_id)
    if found is None:
        error_line(
            f"job {printable(job_id)}: not among the first {SCAN} waiting jobs of each "
            "priority (a running job is cancelled: aqw job cancel)"
        )
        return 1
    outcome = await app.cancel(job_id)
    if outcome in ("cancelling", "finished"):
        error_line(f"job {printable(job_id)}: taken by a worker meanwhile; not deleted")
        return 1
    deleted = await control.delete_waiting(*found)
    print(f"job {printable(job_id)}: " + ("deleted" if deleted else "cancelled (it never runs)"))
    return 0


#: Most waiting jobs of each level ``delete`` looks through for the id.
SCAN = 10_000


async def find_waiting(control: QueueControl, job_id: str) -> tuple[int, str] | None:
    """(level, entry id) of the waiting job ``job_id`` among each level's first ``SCAN``."""
    needle = job_id.encode()
    for level in sorted(await control.waiting_counts(), reverse=True):
        after: str | None = None
        seen = 0
        while seen < SCAN:
            page = await control.waiting_page(level, after, 500)
            if not page:
                break
            for entry in page:
                if needle in entry.data and _job_id(entry.data) == job_id:
                    return level, entry.entry_id
            seen += len(page)
            after = page[-1].entry_id
    return None


def _job_id(data: bytes) -> str | None:
    try:
        return Job.decode(data).id
    except Exception:
        return None
