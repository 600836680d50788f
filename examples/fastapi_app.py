"""A FastAPI application that runs an aqw worker in its lifespan.

Endpoints:

- ``POST /jobs`` enqueues a report job (the body is validated: a bad one gets 422); an
  ``Idempotency-Key`` header enqueues at most one job per key.
- ``GET /jobs/{job_id}`` shows a job: ``running`` with its progress while a worker runs it,
  ``completed`` with its result once done, 404 otherwise (waiting, unknown or expired).
- ``GET /health`` reports the embedded worker (503 unless it is running).

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
import time
from typing import Annotated, Any

from fastapi import FastAPI, Header, HTTPException, Request, Response
from pydantic import BaseModel, Field

import aqw
from aqw.brokers.redis import RedisBroker
from aqw.fastapi import health, lifespan, worker_of

#: Seconds a completed job's result stays readable.
RESULT_TTL = 3600


class Report(BaseModel):
    """The payload of a report job."""

    name: str = Field(min_length=1, max_length=100)
    seconds: float = Field(default=1.0, ge=0.0, le=600.0, description="how long it works")
    steps: int = Field(default=4, ge=1, le=100, description="progress updates on the way")


class Results:
    """Where finished jobs leave their result: Redis when the broker is Redis (so any
    process can read it), else a dict in this process."""

    def __init__(self, app: aqw.App) -> None:
        self.broker = app.broker if isinstance(app.broker, RedisBroker) else None
        self.prefix = f"example:{{{app.queue}}}:result:"
        self.local: dict[str, dict[str, Any]] = {}

    async def put(self, job_id: str, result: dict[str, Any]) -> None:
        if self.broker is None:
            self.local[job_id] = result
        else:
            await self.broker.client.set(self.prefix + job_id, json.dumps(result), ex=RESULT_TTL)

    async def get(self, job_id: str) -> dict[str, Any] | None:
        if self.broker is None:
            return self.local.get(job_id)
        raw = await self.broker.client.get(self.prefix + job_id)
        return None if raw is None else dict(json.loads(raw))


def create_app(broker: str | None = None, queue: str | None = None) -> FastAPI:
    """The web application and its job app, configured from arguments or the environment."""
    jobs = aqw.App(
        broker or os.environ.get("AQW_BROKER") or "memory://",
        queue=queue or os.environ.get("AQW_QUEUE") or "reports",
        lease_ttl=10.0,
    )
    results = Results(jobs)

    @jobs.task(name="make_report", max_retries=3)
    async def make_report(data: Report, ctx: aqw.Context) -> None:
        """Work for ``data.seconds`` in ``data.steps`` steps, reporting progress."""
        for step in range(1, data.steps + 1):
            await asyncio.sleep(data.seconds / data.steps)
            await ctx.progress(step / data.steps, f"step {step}/{data.steps}")
        await results.put(
            ctx.job_id,
            {
                "name": data.name,
                "finished_at": time.time(),
                "attempt": ctx.attempt,
                "worker": ctx.worker.name,
            },
        )

    api = FastAPI(
        title="aqw example",
        lifespan=lifespan(
            jobs,
            concurrency=int(os.environ.get("AQW_CONCURRENCY") or 8),
            grace=float(os.environ.get("AQW_GRACE") or 30.0),
        ),
    )
    api.state.jobs = jobs

    @api.post("/jobs", status_code=202)
    async def enqueue(
        report: Report,
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    ) -> dict[str, Any]:
        job_id = await make_report.enqueue(report, key=idempotency_key)
        return {"job_id": job_id, "duplicate": job_id.duplicate, "status": f"/jobs/{job_id}"}

    @api.get("/jobs/{job_id}")
    async def status(job_id: str) -> dict[str, Any]:
        state = await jobs.job_status(job_id)
        if state is not None:
            return {
                "job_id": job_id,
                "state": "running",
                "progress": float(state.get("progress") or 0.0),
                "message": state.get("message", ""),
                "attempt": int(state.get("attempt") or 1),
                "worker": state.get("worker", ""),
                "started_at": float(state.get("started_at") or 0.0),
            }
        result = await results.get(job_id)
        if result is not None:
            return {"job_id": job_id, "state": "completed", "result": result}
        raise HTTPException(404, f"job {job_id} is not running (waiting, unknown or expired)")

    @api.get("/health")
    async def get_health(request: Request, response: Response) -> dict[str, Any]:
        report = health(worker_of(request.app))
        if not report["ok"]:
            response.status_code = 503
        return report

    return api


app = create_app()
