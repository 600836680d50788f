"""The web dashboard: a server-rendered view of one App's queue, mountable in any
Starlette or FastAPI application (``api.mount("/aqw", aqw.dashboard.create_app(app))``) or
run standalone with ``aqw dashboard``. Needs the ``dashboard`` extra (Starlette, Jinja2;
uvicorn for the command).

Pages: overview (``aqw status``'s numbers and an hour of depth), workers, running jobs
(cancel), delayed and retrying jobs, schedules, the dead-letter queue (grouped by error
fingerprint; replay, replay with an edited payload, purge), one job's record, and the
Redis server's memory. Every page reads a bounded amount, whatever the queue holds; when the
broker does not answer, every page is the broker-down page (503), which names it and reloads
itself until it answers. Every response carries a Content-Security-Policy and the other
security headers of ``_http.py``."""

from ..errors import extra_hint

try:
    from ._app import create_app
    from ._core import AuthHook
except ModuleNotFoundError as exc:  # the extra is not installed: say which, in one line
    _missing = (exc.name or "").partition(".")[0]
    if _missing not in ("starlette", "jinja2", "markupsafe"):
        raise
    raise ImportError(
        f"aqw.dashboard needs the dashboard extra (no module named {_missing!r}): "
        f"{extra_hint('dashboard')}",
        name=_missing,
    ) from None

__all__ = ["AuthHook", "create_app"]
