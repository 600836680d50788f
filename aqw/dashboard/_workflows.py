"""The batch and flow pages: a batch by id (its progress, counts, one page of its children
by state, its callbacks) and a flow by id (its DAG as SVG, each step's state). Bounded: one
read of the batch, one page of ``PAGE`` children, one record read per child or step shown."""

from __future__ import annotations

import json
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..brokers import Broker
from ..workflows import StepInfo, batch_part, read_flow
from ._core import Dashboard
from ._dag import Node, flow_chart
from ._pages import bad_request
from ._queries import PAGE

#: The furthest child offset the batch page pages to.
MAX_START = 10_000_000
#: The longest batch or flow id the pages take.
MAX_ID = 200


def _missing(dash: Dashboard, request: Request, what: str, the_id: str) -> Response:
    message = f"no {what} {the_id} on this queue (unknown id, or past its keep_for)"
    return dash.render(request, "message.html", 404, title="Not found", message=message)


def _checked_id(request: Request, name: str) -> str | None:
    value = str(request.path_params[name])
    return value if 0 < len(value) <= MAX_ID else None


async def batch_children(broker: Broker, batch_id: str, start: int) -> list[dict[str, Any]]:
    """One page of the batch's children: id, state (a nested batch's as a batch), task."""
    ids = await batch_part(broker).children(batch_id, start, PAGE)
    rows: list[dict[str, Any]] = []
    for child in ids:
        if child.startswith("batch:"):
            nested = child.removeprefix("batch:")
            rows.append({"id": nested, "state": "batch", "task": "", "batch": True})
            continue
        record = await broker.records.record(child)
        state = record.state if record is not None else "expired"
        task = record.task if record is not None else ""
        rows.append({"id": child, "state": state, "task": task, "batch": False})
    return rows


async def batch_page(dash: Dashboard, request: Request) -> Response:
    batch_id = _checked_id(request, "batch_id")
    if batch_id is None:
        return bad_request(dash, request, f"the batch id must have 1-{MAX_ID} characters")
    raw = request.query_params.get("start", "0")
    if not raw.isdigit() or int(raw) > MAX_START:
        return bad_request(
            dash, request, f"start must be an offset from 0 to {MAX_START}, got {raw!r}"
        )
    broker = dash.app.broker
    info = await batch_part(broker).info(batch_id)
    if info is None:
        return _missing(dash, request, "batch", batch_id)
    start = int(raw)
    children = await batch_children(broker, batch_id, start)
    by_state: dict[str, list[dict[str, Any]]] = {}
    for row in children:
        by_state.setdefault(row["state"], []).append(row)
    return dash.render(
        request,
        "batch.html",
        info=info,
        flow=bool(info.data),
        children=children,
        by_state=dict(sorted(by_state.items())),
        start=start,
        page=PAGE,
        now=time.time(),
    )


def _page(step: StepInfo) -> str:
    """Where a flow's step links: its job's page, or a batch step's batch's."""
    return "jobs" if step.batch is None else "batches"


async def flow_page(dash: Dashboard, request: Request) -> Response:
    flow_id = _checked_id(request, "flow_id")
    if flow_id is None:
        return bad_request(dash, request, f"the flow id must have 1-{MAX_ID} characters")
    flow = await read_flow(dash.app.broker, flow_id)
    if flow is None:
        return _missing(dash, request, "flow", flow_id)
    base = str(request.scope.get("root_path", "")).rstrip("/")
    quote = dash.templates.filters["q"]
    nodes = [
        Node(s.name, s.after, s.state, f"{base}/{_page(s)}/{quote(s.job_id)}")
        for s in flow.steps.values()
    ]
    states: dict[str, int] = {}
    for s in flow.steps.values():
        states[s.state] = states.get(s.state, 0) + 1
    return dash.render(
        request,
        "flow.html",
        flow=flow,
        chart=flow_chart(nodes),
        states=dict(sorted(states.items())),
        definition=json.dumps({n: list(s.after) for n, s in flow.steps.items()}),
        now=time.time(),
    )
