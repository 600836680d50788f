"""The dashboard's shared state (``Dashboard``) and its guards.

Every request passes the ``auth`` hook; a write action (POST) must also not be
``read_only`` and must come from the dashboard's own origin (``cross_site``). The App's
broker is connected on the first request, once, and its client (a connection pool) serves
every request after that: the dashboard has no lifespan (a mounted sub-app's lifespan is not
run by Starlette or FastAPI)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote, urlsplit

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from .._version import __version__
from ..status import render_span, render_time
from ._queries import DashboardApp

#: ``auth``: a callable of the request returning True (let in) or False (401), or an
#: awaitable of that.
AuthHook = Callable[[Request], bool | Awaitable[bool]]
Endpoint = Callable[["Dashboard", Request], Awaitable[Response]]


def human_bytes(n: int) -> str:
    """``n`` bytes for people: ``512 B``, ``1.5 MiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


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
    ) -> None:
        self.app = app
        self.read_only = read_only
        self.auth = auth
        self.trace_url = trace_url
        self.connected = False
        self._lock = asyncio.Lock()
        self.templates = Environment(
            loader=PackageLoader("aqw.dashboard", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
        )
        self.templates.filters.update(
            when=render_time,
            span=render_span,
            size=human_bytes,
            q=lambda s: quote(str(s), safe=""),
            pct=lambda v: f"{float(v):.0%}",
        )

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

    async def refused(self, request: Request, write: bool) -> Response | None:
        """Why the request is refused (401, 403), or None to serve it."""
        if self.auth is not None:
            verdict = self.auth(request)
            ok = await verdict if inspect.isawaitable(verdict) else verdict
            if not ok:
                return Response(
                    "not authorized\n",
                    status_code=401,
                    headers={"WWW-Authenticate": 'Basic realm="aqw dashboard"'},
                    media_type="text/plain",
                )
        if not write:
            return None
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

    def endpoint(self, handler: Endpoint, write: bool = False) -> Callable[[Request], Any]:
        """A route endpoint: the guards, the lazy connect, then ``handler``."""

        async def serve(request: Request) -> Response:
            refusal = await self.refused(request, write)
            if refusal is not None:
                return refusal
            await self.ready()
            return await handler(self, request)

        return serve


def cross_site(request: Request) -> str | None:
    """Why a POST looks cross-site, or None: the browser says ``Sec-Fetch-Site:
    cross-site`` (or ``same-site``: another origin of the site), or its ``Origin`` is not
    the host the request was sent to. A request with neither header (curl, scripts) is
    not a browser's cross-site form."""
    site = request.headers.get("sec-fetch-site")
    if site in ("cross-site", "same-site"):
        return f"cross-site request refused (Sec-Fetch-Site: {site})"
    origin = request.headers.get("origin")
    if origin is None:
        return None
    host = request.headers.get("host", "")
    if origin == "null" or urlsplit(origin).netloc.lower() != host.lower():
        return f"cross-site request refused (Origin {origin} is not {host})"
    return None
