"""The dashboard's pages (GET): each reads what ``_queries.py`` gives it and renders one
template. Query parameters are checked; a bad one gets a 400 page naming it."""

from __future__ import annotations

import re
import time

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from . import _queries as q
from ._core import Dashboard
from ._svg import depth_chart

#: A DLQ entry id as brokers make them (``<ms>-<seq>``; ``<ms>-<seq>~p<N>`` on a
#: partitioned queue).
ENTRY_ID = re.compile(r"^\d{1,20}-\d{1,20}(?:~p\d{1,4})?$")
#: The furthest offset the delayed list pages to.
MAX_START = 10_000_000


def _bad(dash: Dashboard, request: Request, message: str) -> Response:
    return dash.render(request, "message.html", 400, title="Bad request", message=message)


async def overview(dash: Dashboard, request: Request) -> Response:
    data = await q.overview(dash.app)
    chart = depth_chart(data["history"], q.CHART_SPAN)
    return dash.render(request, "overview.html", chart=chart, now=time.time(), **data)


async def workers(dash: Dashboard, request: Request) -> Response:
    rows = await q.workers(dash.app)
    return dash.render(request, "workers.html", rows=rows, now=time.time())


async def running(dash: Dashboard, request: Request) -> Response:
    data = await q.running(dash.app)
    return dash.render(request, "running.html", now=time.time(), **data)


async def delayed(dash: Dashboard, request: Request) -> Response:
    raw = request.query_params.get("start", "0")
    if not raw.isdigit() or int(raw) > MAX_START:
        return _bad(dash, request, f"start must be an offset from 0 to {MAX_START}, got {raw!r}")
    data = await q.delayed(dash.app, int(raw))
    return dash.render(request, "delayed.html", now=time.time(), **data)


async def schedules(dash: Dashboard, request: Request) -> Response:
    data = await q.schedules(dash.app)
    return dash.render(request, "schedules.html", **data)


async def dead_letters(dash: Dashboard, request: Request) -> Response:
    after = request.query_params.get("after") or None
    if after is not None and not ENTRY_ID.match(after):
        return _bad(dash, request, f"after must be a DLQ entry id such as 1-0, got {after!r}")
    data = await q.dead_letters(dash.app, after)
    return dash.render(request, "dlq.html", now=time.time(), **data)


async def dead_entry(dash: Dashboard, request: Request) -> Response:
    entry_id = request.path_params["entry_id"]
    if not ENTRY_ID.match(entry_id):
        return _bad(dash, request, f"entry must be a DLQ entry id such as 1-0, got {entry_id!r}")
    data = await q.dead_entry(dash.app, entry_id)
    if data is None:
        message = f"no dead-letter entry {entry_id} (replayed or purged)"
        return dash.render(request, "message.html", 404, title="Not found", message=message)
    return dash.render(request, "dlq_entry.html", now=time.time(), error=None, **data)


async def find_job(dash: Dashboard, request: Request) -> Response:
    job_id = request.query_params.get("id", "").strip()
    if not job_id or len(job_id) > 200:
        return _bad(dash, request, "id must name a job (1-200 characters)")
    base = str(request.scope.get("root_path", "")).rstrip("/")
    url = f"{base}/jobs/{dash.templates.filters['q'](job_id)}"
    return RedirectResponse(url, status_code=303)


async def job(dash: Dashboard, request: Request) -> Response:
    job_id = request.path_params["job_id"]
    if not job_id or len(job_id) > 200:
        return _bad(dash, request, "the job id must have 1-200 characters")
    data = await q.job_detail(dash.app, job_id)
    status = 200 if data["info"] is not None else 404
    return dash.render(request, "job.html", status, job_id=job_id, now=time.time(), **data)


async def redis(dash: Dashboard, request: Request) -> Response:
    health = await q.redis_health(dash.app.broker)
    return dash.render(request, "redis.html", health=health)


#: The 400 page, for the other page module (``_controls.py``).
bad_request = _bad
