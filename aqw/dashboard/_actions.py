"""The dashboard's write actions (POST, urlencoded forms): cancel a job, replay dead jobs
(one, a group, all, or one with an edited payload) and purge them.

Each action asks for confirmation first: a form posted without ``confirm=yes`` gets a page
that repeats it with a "yes" button. The guards (read-only, cross-site, auth) ran before
(``Dashboard.endpoint``). "All" means the ``ACTION_LIMIT`` oldest entries: one action costs a
bounded number of broker calls, and the page says how many are left."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from .._text import printable
from ..errors import AqwError
from . import _queries as q
from ._core import Dashboard
from ._pages import ENTRY_ID

#: Most dead-letter entries one "replay all" or "purge all" handles.
ACTION_LIMIT = 1000
#: Most bytes of a posted form.
MAX_FORM = 2 * 1024 * 1024

Form = dict[str, list[str]]


async def _form(request: Request) -> Form | None:
    """The posted urlencoded form, or None when it is too big."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            return None
    return parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)


def _one(form: Form, name: str) -> str:
    values = form.get(name) or [""]
    return values[0]


def _message(
    dash: Dashboard, request: Request, title: str, text: str, status: int = 200, back: str = "/dlq"
) -> Response:
    return dash.render(request, "message.html", status, title=title, message=text, back=back)


def _confirm(dash: Dashboard, request: Request, form: Form, question: str, back: str) -> Response:
    fields = [(k, v) for k, values in form.items() if k != "confirm" for v in values]
    return dash.render(
        request,
        "confirm.html",
        question=question,
        fields=fields,
        action=request.url.path,
        back=back,
    )


def _entry_ids(dash: Dashboard, request: Request, form: Form) -> list[str] | Response:
    ids = [i for i in form.get("ids", []) if i]
    bad = [i for i in ids if not ENTRY_ID.match(i)]
    if bad:
        return _message(
            dash,
            request,
            "Bad request",
            f"ids must be DLQ entry ids such as 1-0, got {bad[0]!r}",
            400,
        )
    if len(ids) > ACTION_LIMIT:
        return _message(
            dash,
            request,
            "Bad request",
            f"ids names {len(ids)} entries; at most {ACTION_LIMIT} at a time",
            400,
        )
    return ids


async def _selected(dash: Dashboard, request: Request, form: Form) -> list[str] | Response:
    """The entry ids an action names: ``ids``, or the ``ACTION_LIMIT`` oldest (``all=1``)."""
    if _one(form, "all") == "1":
        return [d.id for d in await dash.app.broker.dlq_list(ACTION_LIMIT)]
    ids = _entry_ids(dash, request, form)
    if isinstance(ids, list) and not ids:
        return _message(dash, request, "Bad request", "name entries (ids) or all=1", 400)
    return ids


async def cancel(dash: Dashboard, request: Request) -> Response:
    form = await _form(request)
    if form is None:
        return _message(dash, request, "Bad request", "the form is too big", 413)
    job_id = _one(form, "job_id")
    if not job_id or len(job_id) > 200:
        return _message(dash, request, "Bad request", "job_id must have 1-200 characters", 400)
    back = f"/jobs/{dash.templates.filters['q'](job_id)}"
    if _one(form, "confirm") != "yes":
        return _confirm(dash, request, form, f"Cancel job {job_id}?", back)
    outcome = await dash.app.cancel(job_id)
    text = {
        "cancelled": "cancelled: it had not started and never will",
        "cancelling": "cancelling: its handler stops at its next lease renewal",
        "finished": "it had already ended: nothing changed",
        "unknown": "there is no record of it: nothing changed",
    }[outcome]
    return _message(
        dash, request, f"Job {job_id}", text, 404 if outcome == "unknown" else 200, back=back
    )


async def replay(dash: Dashboard, request: Request) -> Response:
    form = await _form(request)
    if form is None:
        return _message(dash, request, "Bad request", "the form is too big", 413)
    if _one(form, "confirm") != "yes":
        many = "all dead jobs" if _one(form, "all") == "1" else None
        count = len(form.get("ids", []))
        what = many or ("1 dead job" if count == 1 else f"{count} dead jobs")
        return _confirm(dash, request, form, f"Replay {what}?", "/dlq")
    ids = await _selected(dash, request, form)
    if isinstance(ids, Response):
        return ids
    done = await dash.app.dlq.replay(ids)
    left = (await dash.app.broker.depth()).dead
    return _message(
        dash,
        request,
        "Replayed",
        f"replayed {done} of {len(ids)} entries; {left} left in the dead-letter queue",
    )


async def purge(dash: Dashboard, request: Request) -> Response:
    form = await _form(request)
    if form is None:
        return _message(dash, request, "Bad request", "the form is too big", 413)
    if _one(form, "confirm") != "yes":
        count = len(form.get("ids", []))
        what = "all dead jobs" if _one(form, "all") == "1" else f"{count} dead job(s)"
        return _confirm(dash, request, form, f"Delete {what} for good?", "/dlq")
    ids = await _selected(dash, request, form)
    if isinstance(ids, Response):
        return ids
    done = await dash.app.dlq.purge(ids=ids) if ids else 0
    left = (await dash.app.broker.depth()).dead
    return _message(
        dash, request, "Purged", f"deleted {done} entries; {left} left in the dead-letter queue"
    )


async def replay_edited(dash: Dashboard, request: Request) -> Response:
    """Replay one entry with the posted payload (JSON), validated against its task's
    payload model first: a bad payload shows the error and replays nothing."""
    form = await _form(request)
    if form is None:
        return _message(dash, request, "Bad request", "the form is too big", 413)
    entry_id = _one(form, "entry")
    if not ENTRY_ID.match(entry_id):
        return _message(
            dash,
            request,
            "Bad request",
            f"entry must be a DLQ entry id such as 1-0, got {entry_id!r}",
            400,
        )
    data = await q.dead_entry(dash.app, entry_id)
    if data is None or data["job"] is None:
        return _message(
            dash, request, "Not found", f"no replayable dead-letter entry {entry_id}", 404
        )
    text = _one(form, "payload")
    error = _check_payload(dash, data["job"].task, text)
    if error is not None:
        data["edit"] = text
        return dash.render(request, "dlq_entry.html", 400, error=error, **data)
    if _one(form, "confirm") != "yes":
        return _confirm(
            dash, request, form, f"Replay entry {entry_id} with the edited payload?", "/dlq"
        )
    done = await dash.app.dlq.replay([entry_id], edit_payload=json.loads(text))
    return _message(
        dash,
        request,
        "Replayed",
        f"replayed {done} entry with the edited payload"
        if done
        else f"entry {entry_id} was not replayed (gone meanwhile)",
    )


def _check_payload(dash: Dashboard, task_name: str, text: str) -> str | None:
    """Why ``text`` is not a valid payload of ``task_name``, or None."""
    try:
        value: Any = json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        return f"payload is not JSON: {exc}"
    try:
        dash.app.get_task(task_name).validate(value)
    except ValidationError as exc:
        return f"payload does not fit {task_name}: " + printable(exc, keep_newlines=True)
    except (AqwError, ValueError, TypeError) as exc:
        return f"payload refused: {exc}"
    return None


def _no_constant(name: str) -> Any:
    """``json.loads`` takes ``NaN`` and ``Infinity``, which are not JSON: refused."""
    raise ValueError(f"{name} is not a JSON number")


#: The helpers above, for the other action module (``_controls.py``).
read_form, field, message, confirm = _form, _one, _message, _confirm
