"""The dashboard's limits page (``/limits``): each task's rate limit and per-key cap as
registered, as in force now (changed at run time by ``aqw limits set``, ``app.limits`` or
this page; an ``aqw.Adaptive`` limit's current value), and a form to set or reset one
(``app.limits``, the broker's ``run_limits`` part). Each change asks for confirmation
first, as every action does; the guards (read-only, cross-site, auth) ran before."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ..errors import AqwError
from ._actions import confirm, field, message, read_form
from ._core import Dashboard

#: Most characters of a limit's name (``<task>`` or ``<task>:<rate key>``) or value.
MAX_FIELD = 300


def _floor(dash: Dashboard, name: str) -> str | None:
    """The least an adaptive rate limit of ``name``'s task goes down to, else None."""
    try:
        floor = dash.app.get_task(name.partition(":")[0]).options.flow.floor
    except AqwError:
        return None
    return None if floor is None else str(floor)


async def page(dash: Dashboard, request: Request) -> Response:
    if dash.app.broker.run_limits is None:
        text = f"the {dash.app.broker.system} broker keeps no limits with the queue"
        return dash.render(request, "message.html", 404, title="Not offered", message=text)
    rows = []
    for row in await dash.app.limits.show():
        floor = _floor(dash, row["name"]) if row["kind"] == "rate" else None
        changed = row["now"] != row["registered"]
        rows.append({**row, "min": floor, "changed": changed})
    return dash.render(request, "limits.html", rows=rows)


async def change(dash: Dashboard, request: Request) -> Response:
    """Set (``value`` a rate such as ``20/s``, or a count for ``kind=max_per_key``) or reset
    (``reset=1``) the limit ``name``."""
    form = await read_form(request)
    if form is None:
        return message(dash, request, "Bad request", "the form is too big", 413, back="/limits")
    name, kind, value = field(form, "name"), field(form, "kind"), field(form, "value").strip()
    reset = field(form, "reset") == "1"
    if not name or len(name) > MAX_FIELD or len(value) > MAX_FIELD:
        text = f"name must have 1-{MAX_FIELD} characters, value at most {MAX_FIELD}"
        return message(dash, request, "Bad request", text, 400, back="/limits")
    if kind not in ("rate", "max_per_key"):
        text = f"kind must be rate or max_per_key, got {kind!r}"
        return message(dash, request, "Bad request", text, 400, back="/limits")
    if not reset and not value:
        text = "value must be a rate such as 20/s" if kind == "rate" else "value must be a count"
        return message(dash, request, "Bad request", text, 400, back="/limits")
    if kind == "max_per_key" and not reset and not value.isdigit():
        text = f"max_per_key must be an integer >= 1, got {value!r}"
        return message(dash, request, "Bad request", text, 400, back="/limits")
    if field(form, "confirm") != "yes":
        what = "registered values" if reset else value
        question = f"Set {name}'s {'limits' if reset else kind} to {what} for every worker?"
        return confirm(dash, request, form, question, "/limits")
    limits = dash.app.limits
    try:
        if reset:
            await limits.reset(name)
        elif kind == "rate":
            await limits.set(name, value)
        else:
            await limits.set(name, max_per_key=int(value))
    except AqwError as exc:
        return message(dash, request, "Refused", str(exc), 400, back="/limits")
    text = "back to its registered limits" if reset else f"{kind} now {value}"
    text += ": every worker honours it within a second"
    return message(dash, request, f"Limits of {name}", text, back="/limits")
