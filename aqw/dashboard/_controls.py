"""The dashboard's queue pages and actions besides the dead letters: the waiting list per
priority level (``/waiting``), throughput and durations over 1 h / 24 h / 7 d (``/rates``),
pausing and resuming the queue, deleting a waiting job and running a delayed one now (the
broker's ``control`` and ``rates`` parts). Each action asks for confirmation first, as
every action of ``_actions.py`` does; the guards ran before (``Dashboard.endpoint``)."""

from __future__ import annotations

import re
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..brokers.tallies import TaskTally, quantile
from ..job import MAX_PRIORITY
from . import _queries as q
from ._actions import confirm as _confirm
from ._actions import field as _one
from ._actions import message as _message
from ._actions import read_form as _form
from ._core import Dashboard
from ._pages import bad_request as _bad
from ._svg import rate_chart

#: A stream entry id (``<ms>-<seq>``; ``<ms>-<seq>~p<N>`` on a partitioned queue).
STREAM_ID = re.compile(r"^\d{1,20}-\d{1,20}(?:~p\d{1,4})?$")
#: The ranges of the rates page: name -> (seconds, hourly buckets).
RANGES = {"1h": (3600.0, False), "24h": (86400.0, True), "7d": (7 * 86400.0, True)}
#: The outcomes the rates page counts, in its columns' order.
OUTCOMES = ("processed", "failed", "retried", "dead", "skipped", "deferred")


# -- pages --------------------------------------------------------------------------------------


async def waiting(dash: Dashboard, request: Request) -> Response:
    raw_level = request.query_params.get("level", "0")
    if not raw_level.isdigit() or int(raw_level) > MAX_PRIORITY:
        return _bad(dash, request, f"level must be 0 to {MAX_PRIORITY}, got {raw_level!r}")
    after = request.query_params.get("after") or None
    if after is not None and not STREAM_ID.match(after):
        return _bad(dash, request, f"after must be an entry id such as 1-0, got {after!r}")
    control = dash.app.broker.control
    if control is None:
        return _unsupported(dash, request, "list the waiting jobs")
    level = int(raw_level)
    counts = await control.waiting_counts()
    page = await control.waiting_page(level, after, q.PAGE)
    rows = []
    for entry in page:
        job = q.decode(entry.data)
        rows.append(
            {
                "entry_id": entry.entry_id,
                "level": entry.level,
                "job_id": job.id if job else "",
                "task": job.task if job else "(not a valid job)",
                "attempt": job.attempt if job else 0,
                "enqueued": int(entry.entry_id.partition("-")[0]) / 1000,  # ms in the id
            }
        )
    return dash.render(
        request,
        "waiting.html",
        rows=rows,
        counts=sorted(counts.items(), reverse=True),
        level=level,
        after=after,
        next=page[-1].entry_id if len(page) >= q.PAGE else None,
        paused=await control.paused(),
        page=q.PAGE,
        now=time.time(),
    )


async def rates(dash: Dashboard, request: Request) -> Response:
    name = request.query_params.get("range", "1h")
    if name not in RANGES:
        return _bad(dash, request, f"range must be one of {', '.join(RANGES)}, got {name!r}")
    part = dash.app.broker.rates
    if part is None:
        return _unsupported(dash, request, "keep rates")
    span, hourly = RANGES[name]
    now = time.time()
    buckets = await part.read(now - span, hourly)
    per_task: dict[str, TaskTally] = {}
    points = []
    for start, tasks in sorted(buckets.items()):
        done = failed = 0
        for task, tally in tasks.items():
            per_task.setdefault(task, TaskTally()).merge(tally)
            done += tally.counts.get("processed", 0) + tally.counts.get("skipped", 0)
            failed += tally.counts.get("failed", 0)
        points.append((start, done, failed))
    rows = [_task_row(task, tally) for task, tally in sorted(per_task.items())]
    total = TaskTally()
    for tally in per_task.values():
        total.merge(tally)
    step = 3600.0 if hourly else 60.0
    return dash.render(
        request,
        "rates.html",
        range=name,
        ranges=list(RANGES),
        rows=rows,
        total=_task_row("all tasks", total),
        chart=rate_chart(points, span, step, now),
        step="hour" if hourly else "minute",
        now=now,
    )


def _task_row(task: str, tally: TaskTally) -> dict[str, Any]:
    counts = tally.counts
    finished = counts.get("processed", 0) + counts.get("skipped", 0)
    failed = counts.get("failed", 0)
    attempts = finished + failed
    return {
        "task": task,
        "counts": {name: counts.get(name, 0) for name in OUTCOMES},
        "failure_rate": failed / attempts if attempts else None,
        "p50": quantile(tally.durations, 0.5),
        "p99": quantile(tally.durations, 0.99),
    }


def _unsupported(dash: Dashboard, request: Request, what: str) -> Response:
    system = dash.app.broker.system
    message = f"the {system} broker cannot {what}"
    return dash.render(request, "message.html", 404, title="Not offered", message=message)


# -- actions ------------------------------------------------------------------------------------


async def pause(dash: Dashboard, request: Request) -> Response:
    return await _switch(dash, request, True)


async def resume(dash: Dashboard, request: Request) -> Response:
    return await _switch(dash, request, False)


async def _switch(dash: Dashboard, request: Request, paused: bool) -> Response:
    form = await _form(request)
    if form is None:
        return _message(dash, request, "Bad request", "the form is too big", 413)
    control = dash.app.broker.control
    if control is None:
        return _unsupported(dash, request, "pause a queue")
    queue = dash.app.queue
    verb = "Pause" if paused else "Resume"
    if _one(form, "confirm") != "yes":
        return _confirm(dash, request, form, f"{verb} queue {queue}?", "/")
    changed = await control.pause() if paused else await control.resume()
    if paused:
        text = "paused: workers fetch no more jobs from it (within about a second)"
        text = text if changed else "it was paused already"
    else:
        text = "resumed: workers fetch from it again" if changed else "it was not paused"
    return _message(dash, request, f"Queue {queue}", text, back="/")


async def delete(dash: Dashboard, request: Request) -> Response:
    """Delete a waiting job: its record is cancelled first (should a worker take it
    meanwhile, it never runs), then its entry is deleted unless a worker has taken it."""
    form = await _form(request)
    if form is None:
        return _message(dash, request, "Bad request", "the form is too big", 413)
    entry, job_id, level = _one(form, "entry"), _one(form, "job_id"), _one(form, "level")
    if not STREAM_ID.match(entry) or not level.isdigit() or int(level) > MAX_PRIORITY:
        message = "entry must be an entry id such as 1-0 and level 0 to 9"
        return _message(dash, request, "Bad request", message, 400, back="/waiting")
    if not job_id or len(job_id) > 200:
        message = "job_id must have 1-200 characters"
        return _message(dash, request, "Bad request", message, 400, back="/waiting")
    control = dash.app.broker.control
    if control is None:
        return _unsupported(dash, request, "delete a waiting job")
    back = f"/waiting?level={level}"
    if _one(form, "confirm") != "yes":
        return _confirm(dash, request, form, f"Delete waiting job {job_id}?", back)
    outcome = await dash.app.cancel(job_id)
    if outcome in ("cancelling", "finished"):
        text = "a worker took it meanwhile: not deleted (cancel it from its page)"
        return _message(dash, request, f"Job {job_id}", text, 409, back=back)
    deleted = await control.delete_waiting(int(level), entry)
    text = "deleted" if deleted else "cancelled: it was taken meanwhile and never runs"
    return _message(dash, request, f"Job {job_id}", text, back=back)


async def promote(dash: Dashboard, request: Request) -> Response:
    form = await _form(request)
    if form is None:
        return _message(dash, request, "Bad request", "the form is too big", 413)
    job_id = _one(form, "job_id")
    if not job_id or len(job_id) > 200:
        message = "job_id must have 1-200 characters"
        return _message(dash, request, "Bad request", message, 400, back="/delayed")
    control = dash.app.broker.control
    if control is None:
        return _unsupported(dash, request, "run a delayed job now")
    if _one(form, "confirm") != "yes":
        return _confirm(dash, request, form, f"Run delayed job {job_id} now?", "/delayed")
    if not await control.promote(job_id):
        text = "no delayed job has this id (it ran or was promoted meanwhile)"
        return _message(dash, request, f"Job {job_id}", text, 404, back="/delayed")
    text = "due now: a worker runs it on its next pass"
    return _message(dash, request, f"Job {job_id}", text, back="/delayed")
