"""Run a worker inside a FastAPI (or any Starlette/ASGI lifespan) application.

::

    import aqw
    from aqw.fastapi import health, lifespan, worker_of
    from fastapi import FastAPI, Request

    jobs = aqw.App("redis://127.0.0.1:6379/0", queue="reports")
    api = FastAPI(lifespan=lifespan(jobs, concurrency=16, grace=30.0))

    @api.get("/health")
    async def get_health(request: Request) -> dict[str, object]:
        return health(worker_of(request.app))

The worker starts with the server and stops with it: on SIGTERM/SIGINT uvicorn stops taking
requests, then runs the lifespan's shutdown, where the worker stops fetching, gives running
jobs ``grace`` seconds to finish and hands the rest back to the broker for redelivery. The
server owns the signals; the embedded worker installs no handlers of its own.

To combine it with a lifespan of your own, enter both::

    @contextlib.asynccontextmanager
    async def both(app: FastAPI) -> AsyncIterator[None]:
        async with db_pool(app), lifespan(jobs)(app):
            yield

Nothing here imports FastAPI: ``aqw`` works without it (the ``fastapi`` extra brings it and
uvicorn in: ``pip install -e '.[fastapi]'`` in a checkout of aqw).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    from .app import App
    from .worker import Worker

__all__ = ["STATE_ATTRIBUTE", "health", "lifespan", "worker_of"]

#: The attribute of ``fastapi_app.state`` that holds the running worker.
STATE_ATTRIBUTE = "aqw_worker"


def lifespan(
    app: App,
    *,
    concurrency: int = 100,
    prefetch: int = 0,
    grace: float = 30.0,
    close: bool = True,
) -> Callable[[Any], AbstractAsyncContextManager[None]]:
    """A lifespan that runs a worker of ``app`` for as long as the web application runs.

    Pass the result as ``FastAPI(lifespan=...)``. On startup the worker connects and starts
    consuming (a broker that cannot be reached fails the startup); it is then available as
    ``fastapi_app.state.aqw_worker`` (see ``worker_of``). On shutdown it stops
    gracefully: no new jobs are fetched, running jobs get ``grace`` seconds to finish, and
    any still running after that are cancelled and handed back for immediate redelivery, so
    no job is lost.

    Args:
        app: the aqw App whose tasks the worker runs.
        concurrency: most jobs running at once.
        prefetch: extra jobs fetched ahead of free slots.
        grace: seconds running jobs get to finish on shutdown.
        close: close the app's broker connections after the worker stopped.
    """
    # Validate now, at import time of the web app, rather than on the first startup.
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"lifespan concurrency must be an integer >= 1, got {concurrency!r}")
    if not isinstance(prefetch, int) or prefetch < 0:
        raise ConfigError(f"lifespan prefetch must be an integer >= 0, got {prefetch!r}")
    if grace < 0:
        raise ConfigError(f"lifespan grace must be >= 0 seconds, got {grace!r}")

    @asynccontextmanager
    async def run_worker(web_app: Any) -> AsyncIterator[None]:
        worker = app.worker(
            concurrency=concurrency, prefetch=prefetch, grace=grace, handle_signals=False
        )
        try:
            async with worker:
                setattr(web_app.state, STATE_ATTRIBUTE, worker)
                yield
        finally:
            if close:
                await app.close()

    return run_worker


def worker_of(web_app: Any) -> Worker:
    """The worker that ``lifespan`` runs for ``web_app`` (e.g. ``request.app``).

    Raises ``aqw.ConfigError`` when the application was not started with it.
    """
    worker: Worker | None = getattr(web_app.state, STATE_ATTRIBUTE, None)
    if worker is None:
        raise ConfigError(
            "no aqw worker on this application: create it with FastAPI(lifespan=aqw.fastapi."
            "lifespan(app)) and run it under a server (or asgi_lifespan.LifespanManager)"
        )
    return worker


def health(worker: Worker) -> dict[str, Any]:
    """A health report of ``worker``, ready to return from an endpoint.

    Keys: ``ok`` (True while it is running), ``state`` (idle, running, stopping, stopped),
    ``queue``, ``worker`` (its consumer name), ``concurrency``, ``in_flight``, ``processed``,
    ``failed``, ``retried``, ``dead`` and ``uptime`` (seconds since it started, 0 before).
    """
    stats = worker.stats
    started = worker.started_at
    return {
        "ok": worker.state == "running",
        "state": worker.state,
        "queue": worker.app.queue,
        "worker": worker.name,
        "concurrency": worker.concurrency,
        "in_flight": worker.in_flight,
        "processed": stats.processed,
        "failed": stats.failed,
        "retried": stats.retried,
        "dead": stats.dead,
        "uptime": round(time.time() - started, 3) if started else 0.0,
    }
