"""A flow's DAG, drawn on the server as SVG: each step a box in the column of its depth (the
longest path to it from a first step), coloured by its state, an edge from each parent to
each step after it. Step and task names are the flow's own text: escaped here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape

BOX_W, BOX_H = 150, 44
GAP_X, GAP_Y = 60, 18
PAD = 12

#: The fill of each state's box; any other state is grey.
COLOURS = {
    "waiting": "#e5e7eb",
    "queued": "#dbeafe",
    "delayed": "#fef3c7",
    "running": "#bbf7d0",
    "retrying": "#fde68a",
    "succeeded": "#86efac",
    "dead": "#fca5a5",
    "cancelled": "#d1d5db",
    "expired": "#d1d5db",
}


@dataclass(frozen=True, slots=True)
class Node:
    """What the chart draws of a step: its name, its parents, its state, its link."""

    name: str
    after: Sequence[str]
    state: str
    href: str = ""


def depths(after: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """Each step's column: 0 for a first step, else one more than its deepest parent (a
    parent not in the flow counts as a first step)."""
    out: dict[str, int] = {}

    def depth(name: str, seen: frozenset[str]) -> int:
        if name in out:
            return out[name]
        parents = [p for p in after.get(name, ()) if p in after and p not in seen]
        d = 1 + max((depth(p, seen | {name}) for p in parents), default=-1)
        out[name] = d
        return d

    for name in after:
        depth(name, frozenset())
    return out


def flow_chart(nodes: Sequence[Node]) -> str:
    """An SVG of ``nodes`` as a DAG, left (first steps) to right."""
    col = depths({n.name: n.after for n in nodes})
    rows: dict[int, int] = {}
    at: dict[str, tuple[float, float]] = {}
    for n in nodes:  # in the flow's order within each column
        row = rows.get(col[n.name], 0)
        rows[col[n.name]] = row + 1
        at[n.name] = (PAD + col[n.name] * (BOX_W + GAP_X), PAD + row * (BOX_H + GAP_Y))
    width = PAD * 2 + (max(col.values(), default=0) + 1) * (BOX_W + GAP_X) - GAP_X
    height = PAD * 2 + max(rows.values(), default=1) * (BOX_H + GAP_Y) - GAP_Y
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" font-size="13" class="dag" role="img" '
        'aria-label="the flow\'s steps and their edges">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" '
        'markerHeight="6" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#6b7280"/>'
        "</marker></defs>",
    ]
    for n in nodes:
        x2, y2 = at[n.name]
        for p in n.after:
            if p not in at:
                continue
            x1, y1 = at[p]
            parts.append(
                f'<line x1="{x1 + BOX_W:.0f}" y1="{y1 + BOX_H / 2:.0f}" x2="{x2:.0f}" '
                f'y2="{y2 + BOX_H / 2:.0f}" stroke="#6b7280" marker-end="url(#arrow)" '
                f'data-edge="{escape(p)}&gt;{escape(n.name)}"/>'
            )
    for n in nodes:
        x, y = at[n.name]
        fill = COLOURS.get(n.state, "#e5e7eb")
        name, short, state = escape(n.name), escape(n.name[:20]), escape(n.state)
        box = (
            f'<g class="step" data-step="{name}" data-state="{state}">'
            f'<rect x="{x:.0f}" y="{y:.0f}" width="{BOX_W}" height="{BOX_H}" rx="6" '
            f'fill="{fill}" stroke="#374151"/>'
            f'<text x="{x + 8:.0f}" y="{y + 18:.0f}" font-weight="bold">{short}</text>'
            f'<text x="{x + 8:.0f}" y="{y + 35:.0f}">{state}</text></g>'
        )
        if n.href:
            box = f'<a href="{escape(n.href)}">{box}</a>'
        parts.append(box)
    parts.append("</svg>")
    return "".join(parts)
