"""Live progress on the running page: ``/running/progress?job=ID&job=...`` streams the
running jobs' ``ctx.progress`` updates as server-sent events, read from the broker's
progress stream (``app.progress``, a blocking read: no polling), and ``static/live.js``
moves each row's bar as they come.

Only a watched job costs anything: one reader per job named in the request, none for the
others, none when no page is open. A reader's updates are coalesced (the last one of each
job is sent), so a job that reports a thousand times a second sends what the page can show.
A stream ends when each of its jobs has ended, or after ``STREAM_FOR`` seconds (the browser
opens it again), or when the page goes away; a job whose reader fails (no record of it, the
broker down) is left out of it, and its row keeps what the page showed."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..errors import AqwError
from . import _queries as q
from ._core import Dashboard
from ._pages import bad_request

log = logging.getLogger("aqw.dashboard")

#: Seconds one stream lasts at most before the browser opens it again (``retry``: how long
#: it waits, in milliseconds).
STREAM_FOR = 30.0
RETRY_MS = 2000
#: Seconds between two cancels of a reader that has not ended yet.
STOP_EVERY = 0.1
#: The readers' stops under way (kept until they end).
STOPPING: set[asyncio.Future[None]] = set()


def _event(job_id: str, update: Any) -> str:
    data = {
        "job_id": job_id,
        "fraction": update.fraction,
        "message": update.message,
        "state": update.state,
    }
    return f"event: progress\ndata: {json.dumps(data, ensure_ascii=True)}\n\n"


async def progress(dash: Dashboard, request: Request) -> Response:
    ids = list(dict.fromkeys(request.query_params.getlist("job")))
    if not ids or len(ids) > q.PAGE or any(not i or len(i) > 200 for i in ids):
        return bad_request(dash, request, f"job must name 1 to {q.PAGE} jobs (1-200 characters)")
    if dash.app.broker.progress is None:
        message = f"the {dash.app.broker.system} broker does not stream progress"
        return dash.render(request, "message.html", 404, title="Not offered", message=message)
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(_stream(dash, ids), media_type="text/event-stream", headers=headers)


async def _stream(dash: Dashboard, ids: list[str]) -> AsyncIterator[str]:
    latest: dict[str, Any] = {}
    changed = asyncio.Event()

    failures: tuple[type[BaseException], ...] = (AqwError, *dash.unreachable)

    async def follow(job_id: str) -> None:
        try:
            async for update in dash.app.progress(job_id):
                latest[job_id] = update
                changed.set()
        except failures:
            pass  # no record of it, or the broker is down: its row keeps what it showed
        except Exception:  # a fault of the reader's own: its row stays, the log says why
            log.exception("live progress of job %s stopped", job_id)

    readers = [asyncio.ensure_future(follow(job_id)) for job_id in ids]
    deadline = asyncio.get_running_loop().time() + STREAM_FOR
    try:
        yield f"retry: {RETRY_MS}\n\n"
        while True:
            left = deadline - asyncio.get_running_loop().time()
            live = [r for r in readers if not r.done()]
            if left <= 0 or (not live and not latest):
                break
            waiting = asyncio.ensure_future(changed.wait())
            await asyncio.wait([waiting, *live], timeout=left, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            changed.clear()
            sent = dict(latest)
            latest.clear()
            for job_id, update in sent.items():
                yield _event(job_id, update)
        if all(r.done() for r in readers):
            yield "event: end\ndata: {}\n\n"  # each job ended: the page need not reopen it
    finally:  # in a task of its own: a stream closed by a cancel still stops its readers
        stopper = asyncio.ensure_future(_stop(readers))
        STOPPING.add(stopper)
        stopper.add_done_callback(STOPPING.discard)
        await asyncio.shield(stopper)


async def _stop(readers: list[asyncio.Task[None]]) -> None:
    """Cancel the readers until each has ended: a cancel that lands as a Redis command
    completes can be swallowed, and the reader would read on until its job ends."""
    pending = {r for r in readers if not r.done()}
    while pending:
        for reader in pending:
            reader.cancel()
        _, pending = await asyncio.wait(pending, timeout=STOP_EVERY)
