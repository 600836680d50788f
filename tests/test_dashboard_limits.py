"""The dashboard's limits page (issue 28 item 2, ``aqw/dashboard/_limits.py``) through httpx's
ASGI transport on the in-process broker, fakeredis and the real Redis: each task's rate
limit and per-key cap as registered and in force now, an ``aqw.Adaptive`` limit's current
value and floor; setting and resetting one asks first, then changes ``app.limits`` for
every worker; a bad value is refused naming the field; a read-only dashboard shows no form
and refuses the action."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

import aqw
from aqw.dashboard import create_app
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(60)


def client(web: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=web), base_url="http://dash.test")


def make_app(backend: Backend) -> aqw.App:
    app = backend.app()

    async def h(n: int) -> None: ...

    app.task(name="call", rate_limit=aqw.Adaptive("100/s", min="10/s"))(h)
    app.task(name="mail", rate_limit="20/s", concurrency_key=lambda n: n, max_per_key=2)(h)
    app.task(name="plain")(h)
    return app


def rows(html: str) -> dict[tuple[str, str], list[str]]:
    """The limits table: (name, kind) -> its cells' text (tags stripped)."""
    out = {}
    for name, kind, body in re.findall(
        r'<tr data-name="([^"]+)" data-kind="([^"]+)"[^>]*>(.*?)</tr>', html, re.S
    ):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", body, re.S)
        out[(name, kind)] = [re.sub(r"<[^>]+>", "", c).split("Set")[0].strip() for c in cells]
    return out


async def test_the_page_shows_registered_now_and_adaptive(backend: Backend) -> None:
    app = make_app(backend)
    store = app.broker.run_limits
    assert store is not None
    await store.write("rate:call", "25/s")  # what two 429s leave of an adaptive 100/s
    async with client(create_app(app)) as c:
        page = await c.get("/limits")
    assert page.status_code == 200
    assert rows(page.text) == {
        ("call", "rate"): ["call", "rate", "100/s", "25/s adaptive", "10/s to 100/s", ""],
        ("mail", "rate"): ["mail", "rate", "20/s", "20/s", "-", ""],
        ("mail", "max_per_key"): ["mail", "max_per_key", "2", "2", "-", ""],
    }
    assert page.text.count('name="reset" value="1"') == 1  # only a changed limit resets


async def test_set_asks_first_then_changes_the_limit_and_reset_restores(backend: Backend) -> None:
    app = make_app(backend)
    async with client(create_app(app)) as c:
        form = {"name": "mail", "kind": "rate", "value": "5/s"}
        ask = await c.post("/actions/limits", data=form)
        assert ask.status_code == 200 and "Set mail&#39;s rate to 5/s for every worker?" in ask.text
        assert [r["now"] for r in await app.limits.show()] == ["100/s", "20/s", "2"]
        done = await c.post("/actions/limits", data={**form, "confirm": "yes"})
        assert done.status_code == 200 and "rate now 5/s" in done.text
        cap = {"name": "mail", "kind": "max_per_key", "value": "1", "confirm": "yes"}
        assert (await c.post("/actions/limits", data=cap)).status_code == 200
        assert [r["now"] for r in await app.limits.show()] == ["100/s", "5/s", "1"]
        page = await c.get("/limits")
        assert rows(page.text)[("mail", "rate")][3] == "5/s changed"
        reset = {"name": "mail", "kind": "rate", "reset": "1"}
        ask = await c.post("/actions/limits", data=reset)
        assert "registered values" in ask.text
        assert [r["now"] for r in await app.limits.show()] == ["100/s", "5/s", "1"]
        done = await c.post("/actions/limits", data={**reset, "confirm": "yes"})
        assert done.status_code == 200 and "back to its registered limits" in done.text
    assert [r["now"] for r in await app.limits.show()] == ["100/s", "20/s", "2"]


@pytest.mark.parametrize(
    ("form", "said"),
    [
        ({"name": "mail", "kind": "rate", "value": "fast"}, "rate_limit must be"),
        ({"name": "plain", "kind": "rate", "value": "5/s"}, "has no rate_limit to change"),
        ({"name": "nope", "kind": "rate", "value": "5/s"}, "unknown task"),
        ({"name": "mail", "kind": "max_per_key", "value": "x"}, "max_per_key must be"),
        ({"name": "mail", "kind": "max_per_key", "value": "0"}, "max_per_key must be"),
        ({"name": "mail", "kind": "speed", "value": "1"}, "kind must be"),
        ({"name": "", "kind": "rate", "value": "5/s"}, "name must have"),
        ({"name": "mail", "kind": "rate", "value": ""}, "value must be"),
    ],
)
async def test_a_bad_change_is_refused_naming_the_field(
    backend: Backend, form: dict[str, str], said: str
) -> None:
    app = make_app(backend)
    async with client(create_app(app)) as c:
        r = await c.post("/actions/limits", data={**form, "confirm": "yes"})
    assert r.status_code == 400 and said in r.text
    assert [row["now"] for row in await app.limits.show()] == ["100/s", "20/s", "2"]


async def test_read_only_shows_no_form_and_refuses(backend: Backend) -> None:
    app = make_app(backend)
    async with client(create_app(app, read_only=True)) as c:
        page = await c.get("/limits")
        assert page.status_code == 200 and "<form" not in page.text.split("<main>")[1]
        form = {"name": "mail", "kind": "rate", "value": "5/s", "confirm": "yes"}
        r = await c.post("/actions/limits", data=form)
        assert r.status_code == 403 and "read-only" in r.text
    assert [row["now"] for row in await app.limits.show()] == ["100/s", "20/s", "2"]
