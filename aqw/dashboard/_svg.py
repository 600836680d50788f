"""The overview's depth chart, drawn on the server as SVG: one polyline per series (waiting,
in flight, delayed, dead) over the last hour's depth samples. Only numbers and fixed names
go into the markup, so nothing read from the broker needs escaping here."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..brokers.messages import DepthSample

WIDTH, HEIGHT = 720, 200
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 12, 28

#: (field, label, colour) of each series.
SERIES = (
    ("waiting", "waiting", "#2563eb"),
    ("in_flight", "running", "#16a34a"),
    ("delayed", "delayed", "#d97706"),
    ("dead", "dead", "#dc2626"),
)


def depth_chart(samples: Sequence[DepthSample], span: float, now: float | None = None) -> str:
    """An SVG line chart of ``samples`` over the ``span`` seconds up to ``now``."""
    end = time.time() if now is None else now
    start = end - span
    top = max([1, *(max(s.waiting, s.in_flight, s.delayed, s.dead) for s in samples)])
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(at: float) -> float:
        return LEFT + max(0.0, min(1.0, (at - start) / span)) * plot_w

    def y(value: int) -> float:
        return TOP + plot_h - value / top * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'class="chart" role="img" aria-label="queue depth over the last '
        f'{int(span // 60)} minutes">',
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" class="plot"/>',
    ]
    for value in sorted({0, round(top / 2), top}):
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
            f'class="grid"/><text x="{LEFT - 6}" y="{y(value) + 4:.1f}" '
            f'text-anchor="end">{value}</text>'
        )
    for minutes in range(0, int(span // 60) + 1, 15):
        at = end - minutes * 60
        label = "now" if minutes == 0 else f"-{minutes}m"
        parts.append(f'<text x="{x(at):.1f}" y="{HEIGHT - 8}" text-anchor="middle">{label}</text>')
    if not samples:
        parts.append(
            f'<text x="{LEFT + plot_w / 2}" y="{TOP + plot_h / 2}" text-anchor="middle" '
            f'class="empty">no depth samples yet (workers write one every 10 s)</text>'
        )
    for name, label, colour in SERIES:
        points = " ".join(f"{x(s.at):.1f},{y(getattr(s, name)):.1f}" for s in samples)
        if points:
            parts.append(
                f'<polyline points="{points}" fill="none" stroke="{colour}" '
                f'stroke-width="2" data-series="{label}"/>'
            )
    for i, (_, label, colour) in enumerate(SERIES):
        lx = LEFT + 8 + i * 90
        parts.append(
            f'<rect x="{lx}" y="{TOP + 4}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{lx + 14}" y="{TOP + 13}">{label}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def rate_chart(
    points: Sequence[tuple[float, int, int]], span: float, step: float, now: float
) -> str:
    """An SVG chart of finished (blue) and failed (red) attempts per ``step`` seconds over
    the ``span`` seconds up to ``now``: one polyline each, a point per bucket (a bucket
    without counts is 0)."""
    start = now - span
    counts = {int(at): (done, failed) for at, done, failed in points}
    first = int(start - start % step)
    series = [(at, *counts.get(at, (0, 0))) for at in range(first, int(now) + 1, int(step))]
    top = max([1, *(max(d, f) for _, d, f in series)])
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(at: float) -> float:
        return LEFT + max(0.0, min(1.0, (at - start) / span)) * plot_w

    def y(value: int) -> float:
        return TOP + plot_h - value / top * plot_h

    unit = "hour" if step >= 3600 else "minute"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'class="chart" role="img" aria-label="finished and failed attempts per {unit}">',
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" class="plot"/>',
    ]
    for value in sorted({0, round(top / 2), top}):
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
            f'class="grid"/><text x="{LEFT - 6}" y="{y(value) + 4:.1f}" '
            f'text-anchor="end">{value}</text>'
        )
    hours = span / 3600
    for i in range(5):
        at = now - span * i / 4
        ago = hours * i / 4
        if i == 0:
            label = "now"
        elif hours <= 1:
            label = f"-{ago * 60:g}m"
        else:
            label = f"-{ago:g}h" if hours <= 24 else f"-{ago / 24:g}d"
        parts.append(f'<text x="{x(at):.1f}" y="{HEIGHT - 8}" text-anchor="middle">{label}</text>')
    for index, label, colour in ((1, "finished", "#2563eb"), (2, "failed", "#dc2626")):
        line = " ".join(f"{x(p[0] + step / 2):.1f},{y(p[index]):.1f}" for p in series)
        parts.append(
            f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2" '
            f'data-series="{label}"/>'
        )
    for i, (label, colour) in enumerate((("finished", "#2563eb"), ("failed", "#dc2626"))):
        lx = LEFT + 8 + i * 90
        parts.append(
            f'<rect x="{lx}" y="{TOP + 4}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{lx + 14}" y="{TOP + 13}">{label}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
