"""The dashboard's HTTP guards below the pages: the security headers of every response, and
the check that a write comes from the dashboard's own origin.

The headers (``SecurityHeaders``, an ASGI middleware around the whole dashboard, so pages,
assets, refusals and 404s all carry them):

- ``Content-Security-Policy``: scripts, styles and images from the dashboard's own origin
  only (it has no inline script or style; its charts are inline SVG markup, which needs
  none), forms posted only to it, connections (the running page's live progress) only to
  it, no ``<base>``, no plugin, and
  ``frame-ancestors 'none'``;
- ``X-Frame-Options: DENY``: the same for browsers without CSP level 2. A framed dead-letter
  page would let another site's page click "Purge all" and then "Yes, do it" for the user
  (clickjacking): the dashboard is never shown in a frame;
- ``X-Content-Type-Options: nosniff``: an asset is only what its type says;
- ``Referrer-Policy: same-origin``: a link out (a trace link) does not tell the other site
  the dashboard's address and the job id in it."""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: The policy the dashboard's pages satisfy (tests/test_dashboard_browser.py watches for
#: violations in Chromium).
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)

HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
)
_NAMES = {name for name, _ in HEADERS}

#: The port a URL of each scheme means when it names none.
DEFAULT_PORTS = {"http": 80, "https": 443}


class SecurityHeaders:
    """ASGI middleware: ``HEADERS`` on every HTTP response of the wrapped application (in
    place of any of the same name)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _NAMES]
                message = {**message, "headers": [*kept, *HEADERS]}
            await send(message)

        await self.app(scope, receive, with_headers)


def _origin_of(scheme: str, netloc: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin, the default port filled in; None when it is not
    one (an unknown scheme without a port, a port that is not a number)."""
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        port = parts.port
    except ValueError:
        return None
    host = (parts.hostname or "").lower()
    if not host:
        return None
    if port is None:
        port = DEFAULT_PORTS.get(scheme.lower())
        if port is None:
            return None
    return scheme.lower(), host, port


def cross_site(request: Request) -> str | None:
    """Why a POST looks cross-site, or None: the browser says ``Sec-Fetch-Site:
    cross-site`` (or ``same-site``: another origin of the site), or its ``Origin`` is not
    the origin the request was sent to: the same scheme, host and port (the scheme is the
    one the server saw: behind a proxy that ends TLS, let the server read the proxy's
    ``X-Forwarded-Proto``, as uvicorn's ``--proxy-headers`` does). A request with neither
    header (curl, scripts) is not a browser's cross-site form."""
    site = request.headers.get("sec-fetch-site")
    if site in ("cross-site", "same-site"):
        return f"cross-site request refused (Sec-Fetch-Site: {site})"
    origin = request.headers.get("origin")
    if origin is None:
        return None
    host = request.headers.get("host", "")
    here = f"{request.url.scheme}://{host}"
    try:
        parts = urlsplit(origin)
    except ValueError:
        parts = None
    theirs = _origin_of(parts.scheme, parts.netloc) if parts and parts.scheme else None
    if theirs is None or theirs != _origin_of(request.url.scheme, host):
        return f"cross-site request refused (Origin {origin} is not {here})"
    return None
