"""``create_app``: the dashboard as a Starlette application (routes to the pages of
``_pages.py`` and the actions of ``_actions.py``, the assets of ``static/`` behind the same
``auth`` hook), every response with the security headers of ``_http.py``."""

from __future__ import annotations

import math
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..errors import ConfigError
from . import _actions as actions
from . import _controls as controls
from . import _limits as limits
from . import _live as live
from . import _pages as pages
from . import _workflows as workflows
from ._core import AuthHook, Dashboard
from ._http import SecurityHeaders
from ._queries import DashboardApp

STATIC = Path(__file__).parent / "static"
#: Seconds a page waits for the broker before it shows the broker-down page.
BROKER_TIMEOUT = 10.0


def create_app(
    app: DashboardApp,
    *,
    read_only: bool = False,
    auth: AuthHook | None = None,
    trace_url: str | None = None,
    broker_timeout: float = BROKER_TIMEOUT,
) -> Starlette:
    """The dashboard of ``app``'s queue, as an ASGI application.

    Mount it in your own application (``api.mount("/aqw", create_app(app))``) or run it
    with ``aqw dashboard``. It needs no lifespan: the App's broker is connected on the
    first request and its client reused.

    Args:
        app: the ``aqw.App`` whose queue to show.
        read_only: refuse every write action (cancel, replay, purge, pause, resume, delete,
            promote, set or reset a limit) with 403, and show no
            buttons for them.
        auth: called with each request (``starlette.requests.Request``); returns (or
            awaits to) True to serve it, False to answer 401 (with a ``WWW-Authenticate:
            Basic`` challenge). It guards every page, action and asset.
        trace_url: a link template for trace ids, such as
            ``"https://tempo.example/trace/{trace_id}"``.
        broker_timeout: seconds a page waits for the broker; past them, or when the broker
            cannot be reached, the page is the broker-down page (503), which names the
            broker and reloads itself until it answers.
    """
    if trace_url is not None and "{trace_id}" not in trace_url:
        raise ConfigError(f"trace_url must contain {{trace_id}}, got {trace_url!r}")
    if (
        isinstance(broker_timeout, bool)
        or not isinstance(broker_timeout, int | float)
        or not math.isfinite(broker_timeout)
        or broker_timeout <= 0
    ):
        raise ConfigError(
            f"broker_timeout must be a finite number of seconds above 0, got {broker_timeout!r}"
        )
    dash = Dashboard(
        app,
        read_only=read_only,
        auth=auth,
        trace_url=trace_url,
        broker_timeout=float(broker_timeout),
    )
    get = dash.endpoint
    routes = [
        Route("/", get(pages.overview), name="overview"),
        Route("/workers", get(pages.workers), name="workers"),
        Route("/running", get(pages.running), name="running"),
        Route("/running/progress", get(live.progress), name="running_progress"),
        Route("/delayed", get(pages.delayed), name="delayed"),
        Route("/schedules", get(pages.schedules), name="schedules"),
        Route("/dlq", get(pages.dead_letters), name="dlq"),
        Route("/dlq/entry/{entry_id}", get(pages.dead_entry), name="dlq_entry"),
        Route("/jobs", get(pages.find_job), name="find_job"),
        Route("/jobs/{job_id:path}", get(pages.job), name="job"),
        Route("/batches/{batch_id:path}", get(workflows.batch_page), name="batch"),
        Route("/flows/{flow_id:path}", get(workflows.flow_page), name="flow"),
        Route("/redis", get(pages.redis), name="redis"),
        Route("/waiting", get(controls.waiting), name="waiting"),
        Route("/rates", get(controls.rates), name="rates"),
        Route("/limits", get(limits.page), name="limits"),
        Route("/actions/pause", get(controls.pause, True), methods=["POST"]),
        Route("/actions/resume", get(controls.resume, True), methods=["POST"]),
        Route("/actions/delete", get(controls.delete, True), methods=["POST"]),
        Route("/actions/promote", get(controls.promote, True), methods=["POST"]),
        Route("/actions/limits", get(limits.change, True), methods=["POST"]),
        Route("/actions/cancel", get(actions.cancel, True), methods=["POST"]),
        Route("/actions/replay", get(actions.replay, True), methods=["POST"]),
        Route("/actions/replay-edited", get(actions.replay_edited, True), methods=["POST"]),
        Route("/actions/purge", get(actions.purge, True), methods=["POST"]),
        Mount("/static", dash.guarded(StaticFiles(directory=STATIC)), name="static"),
    ]
    return Starlette(routes=routes, middleware=[Middleware(SecurityHeaders)])
