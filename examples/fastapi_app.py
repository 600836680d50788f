"""A FastAPI application that runs an aqw worker in its lifespan.

Endpoints:

- ``POST /jobs`` enqueues a report job (the body is validated: a bad one gets 422); an
  ``Idempotency-Key`` header enqueues at most one job per key.
- ``GET /jobs/{job_id}`` shows the job's record (``app.job``): its state (queued, running,
  succeeded, dead, cancelled...), progress while it runs, its result once it succeeded,
  its last error; 404 for an unknown id.
- ``GET /jobs/{job_id}/result?wait=SECONDS`` waits (without polling) for the job to end and
  returns its result: 200, 409 when it failed, was cancelled or expired, 504 when it has not
  ended in time.
- ``GET /jobs/{job_id}/progress`` streams the job's progress as server-sent events
  (``app.progress``): one ``progress`` event per ``ctx.progress`` update, then one ``end``
  event with its final state, without polling; 404 for an unknown id.
- ``DELETE /jobs/{job_id}`` cancels the job (``app.cancel``): a waiting job never runs, a
  running one is stopped at its next lease renewal.
- ``GET /health`` reports the embedded worker (503 unless it is running).
- ``/aqw/`` is the web dashboard of the queue (``aqw.dashboard``; the ``dashboard`` extra).

Configuration from the environment: ``AQW_BROKER`` (default ``memory://``), ``AQW_QUEUE``
(default ``reports``), ``AQW_CONCURRENCY`` (default 8), ``AQW_GRACE`` (default 30 s).

Run it::

    pip install -e '.[fastapi]' uvicorn    # from a checkout: aqw is not on a package index yet
    AQW_BROKER=redis://127.0.0.1:6379/0 uvicorn fastapi_app:app --app-dir examples
    curl -X POST localhost:8000/jobs -H 'content-type: application/json' \\
        -d '{"name": "q3", "seconds": 5}'
    curl localhost:8000/jobs/<job_id>

On SIGTERM uvicorn stops taking requests, then the worker lets running jobs finish (up to
``AQW_GRACE`` seconds) and hands any unfinished job back to the broker for redelivery.

With ``memory://`` the queue lives in this process: jobs wait only while it runs. Use Redis
to keep them across restarts and share them between processes.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import FastAPI, Header, HTTPException, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

import aqw
from aqw.dashboard import create_app as create_dashboard
from aqw.fastapi import health, lifespan, worker_of


class Report(BaseModel):
    """The payload of a report job."""

    name: str = Field(min_length=1, max_length=100)
    seconds: float = Field(default=1.0, ge=0.0, le=600.0, description="how long it works")
    steps: int = Field(default=4, ge=1, le=100, description="progress updates on the way")


class ReportResult(BaseModel):
    """What a report job returns: kept in its record for an hour (``keep_for``)."""

    name: str
    attempt: int
    worker: str


def create_app(broker: str | None = None, queue: str | None = None) -> FastAPI:
    """The web application and its job app, configured from arguments or the environment."""
    jobs = aqw.App(
        broker or os.environ.get("AQW_BROKER") or "memory://",
        queue=queue or os.environ.get("AQW_QUEUE") or "reports",
        lease_ttl=10.0,
    )

    @jobs.task(name="make_report", max_retries=3, keep_result=True, keep_for=3600)
    async def make_report(data: Report, ctx: aqw.Context) -> ReportResult:
        """Work for ``data.seconds`` in ``data.steps`` steps, reporting progress."""
        for step in range(1, data.steps + 1):
            await asyncio.sleep(data.seconds / data.steps)
            await ctx.progress(step / data.steps, f"step {step}/{data.steps}")
        return ReportResult(name=data.name, attempt=ctx.attempt, worker=ctx.worker.name)

    api = FastAPI(
        title="aqw example",
        lifespan=lifespan(
            jobs,
            concurrency=int(os.environ.get("AQW_CONCURRENCY") or 8),
            grace=float(os.environ.get("AQW_GRACE") or 30.0),
        ),
    )
    api.state.jobs = jobs
    api.mount("/aqw", create_dashboard(jobs))  # the web dashboard: no lifespan of its own

    @api.post("/jobs", status_code=202)
    async def enqueue(
        report: Report,
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    ) -> dict[str, Any]:
        job_id = await make_report.enqueue(report, key=idempotency_key)
        return {"job_id": job_id, "duplicate": job_id.duplicate, "status": f"/jobs/{job_id}"}

    @api.get("/jobs/{job_id}")
    async def status(job_id: str) -> dict[str, Any]:
        info = await jobs.job(job_id)
        if info is None:
            raise HTTPException(404, f"no record of job {job_id} (unknown, or expired)")
        return info.model_dump(mode="json", exclude={"damaged"})

    @api.get("/jobs/{job_id}/result")
    async def result(job_id: str, wait: Annotated[float, Query(gt=0, le=30)] = 10.0) -> Any:
        try:
            return await jobs.result(job_id, timeout=wait)
        except aqw.UnknownJob as exc:
            raise HTTPException(404, str(exc)) from None
        except (aqw.JobFailed, aqw.JobCancelled, aqw.JobExpired, aqw.ResultNotKept) as exc:
            raise HTTPException(409, str(exc)) from None
        except TimeoutError:
            raise HTTPException(504, f"job {job_id} has not ended within {wait}s") from None

    @api.get("/jobs/{job_id}/progress")
    async def progress(job_id: str) -> StreamingResponse:
        updates = jobs.progress(job_id)
        try:
            first = await anext(updates)  # an unknown job: 404 before the stream starts
        except aqw.UnknownJob as exc:
            raise HTTPException(404, str(exc)) from None

        async def events() -> AsyncIterator[str]:
            p = first
            while True:
                if p.final:
                    yield f"event: end\ndata: {json.dumps({'state': p.state})}\n\n"
                    return
                data = {"fraction": p.fraction, "message": p.message, "detail": p.detail}
                yield f"event: progress\ndata: {json.dumps(data)}\n\n"
                p = await anext(updates)

        return StreamingResponse(events(), media_type="text/event-stream")

    @api.delete("/jobs/{job_id}", status_code=202)
    async def cancel(job_id: str) -> dict[str, Any]:
        outcome = await jobs.cancel(job_id)
        if outcome == "unknown":
            raise HTTPException(404, f"no record of job {job_id} (unknown, or expired)")
        return {"job_id": job_id, "outcome": outcome}

    @api.get("/health")
    async def get_health(request: Request, response: Response) -> dict[str, Any]:
        report = health(worker_of(request.app))
        if not report["ok"]:
            response.status_code = 503
        return report

    return api


app = create_app()
