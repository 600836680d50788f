"""The dashboard's shared state (``Dashboard``) and its guards.

Every request passes the ``auth`` hook (pages, actions and the assets of ``/static``); a
write action (POST) must also not be ``read_only`` and must come from the dashboard's own
origin (``_http.cross_site``). The App's broker is connected on the first request, once, and
its client (a connection pool) serves every request after that: the dashboard has no
lifespan (a mounted sub-app's lifespan is not run by Starlette or FastAPI). A page that
cannot reach the broker, or gets no answer within ``broker_timeout``, shows the broker-down
page (503) and the outage is logged once (``_outage.BrokerWatch``)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from .._version import __version__
from ..errors import BrokerUnavailable
from ..status import render_span
from ._format import human_bytes, seconds_shown, when
from ._http import cross_site
from ._outage import BrokerWatch
from ._queries import DashboardApp

#: ``auth``: a callable of the request returning True (let in) or False (401), or an
#: awaitable of that.
AuthHook = Callable[[Request], bool | Awaitable[bool]]
Endpoint = Callable[["Dashboard", Request], Awaitable[Response]]


class Dashboard:
    """The state shared by the dashboard's requests: the App, the options, the templates
    and whether the broker is connected yet."""

    def __init__(
        self,
        app: DashboardApp,
        *,
        read_only: bool,
        auth: AuthHook | None,
        trace_url: str | None,
        broker_timeout: float,
    ) -> None:
        self.app = app
        self.read_only = read_only
        self.auth = auth
        self.trace_url = trace_url
        self.broker_timeout = broker_timeout
        self.connected = False
        self.watch = BrokerWatch(lambda: self.app.broker.describe())
        self._lock = asyncio.Lock()
        self.templates = Environment(
            loader=PackageLoader("aqw.dashboard", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
        )
        self.templates.filters.update(
            when=when,
            when_full=lambda at, now=None: when(at, now, full=True),
            span=render_span,
            size=human_bytes,
            q=lambda s: quote(str(s), safe=""),
            pct=lambda v: f"{float(v):.0%}",
            duration=seconds_shown,
        )

    @property
    def unreachable(self) -> tuple[type[BaseException], ...]:
        """What a request meets when the broker does not answer."""
        return (*self.app.broker.transient_errors, BrokerUnavailable)

    async def ready(self) -> None:
        """Connect the App's broker on the first request (idempotent; never per request)."""
        if self.connected:
            return
        async with self._lock:
            if not self.connected:
                await self.app.broker.connect()
                self.connected = True

    def render(self, request: Request, name: str, code: int = 200, **data: Any) -> Response:
        """Template ``name`` with the page's data; every value is escaped (autoescape)."""
        base = str(request.scope.get("root_path", "")).rstrip("/")
        data.setdefault("now", time.time())
        html = self.templates.get_template(name).render(
            base=base,
            queue=self.app.queue,
            read_only=self.read_only,
            version=__version__,
            trace_url=self.trace_url,
            path=request.url.path,
            **data,
        )
        return HTMLResponse(html, status_code=code)

    async def denied(self, request: Request) -> Response | None:
        """The 401 of a request the ``auth`` hook refuses, or None to serve it."""
        if self.auth is None:
            return None
        verdict = self.auth(request)
        ok = await verdict if inspect.isawaitable(verdict) else verdict
        if ok:
            return None
        return Response(
            "not authorized\n",
            status_code=401,
            headers={"WWW-Authenticate": 'Basic realm="aqw dashboard"'},
            media_type="text/plain",
        )

    async def refused(self, request: Request, write: bool) -> Response | None:
        """Why the request is refused (401, 403), or None to serve it."""
        denied = await self.denied(request)
        if denied is not None or not write:
            return denied
        if self.read_only:
            return self.render(
                request,
                "message.html",
                403,
                title="Refused",
                message="this dashboard is read-only: no action is taken",
            )
        why = cross_site(request)
        if why is not None:
            return self.render(request, "message.html", 403, title="Refused", message=why)
        return None

    def broker_down(self, request: Request) -> Response:
        """The broker-down page (503): which broker, since when, why; it reloads itself."""
        response = self.render(
            request,
            "down.html",
            503,
            where=self.watch.where(),
            since=self.watch.down_since,
            reason=self.watch.reason,
        )
        response.headers["Retry-After"] = "5"
        return response

    async def serve(self, handler: Endpoint, request: Request, write: bool = False) -> Response:
        """``handler``'s response after the lazy connect, or the broker-down page. A page
        (a read) waits at most ``broker_timeout`` for the broker; an action is not cut
        short, so that it is never left half done by the dashboard."""
        started = time.time()
        try:
            async with asyncio.timeout(None if write else self.broker_timeout):
                await self.ready()
                response = await handler(self, request)
        except TimeoutError as exc:
            no_answer = TimeoutError(f"no answer within {self.broker_timeout:g}s")
            self.watch.failed(exc if str(exc) else no_answer)
            return self.broker_down(request)
        except self.unreachable as exc:
            self.watch.failed(exc)
            return self.broker_down(request)
        self.watch.answered(started)
        return response

    def endpoint(self, handler: Endpoint, write: bool = False) -> Callable[[Request], Any]:
        """A route endpoint: the guards, then ``handler`` (``serve``)."""

        async def endpoint(request: Request) -> Response:
            refusal = await self.refused(request, write)
            if refusal is not None:
                return refusal
            return await self.serve(handler, request, write)

        return endpoint

    def guarded(self, app: ASGIApp) -> ASGIApp:
        """``app`` (the assets) behind the ``auth`` hook, as every page is."""

        async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                denied = await self.denied(Request(scope, receive))
                if denied is not None:
                    await denied(scope, receive, send)
                    return
            await app(scope, receive, send)

        return guarded
