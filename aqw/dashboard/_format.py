"""How the dashboard writes values for people: times on one line, sizes, and an error's
reason said once."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from markupsafe import Markup

from .._readback import to_float
from .._redact import redact_error
from ..status import render_span


def human_bytes(n: int) -> str:
    """``n`` bytes for people: ``512 B``, ``1.5 MiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def seconds_shown(seconds: float) -> str:
    """A duration for people: ``0.4 ms``, ``12.0 ms``, ``3.2 s``, ``5m 2s``."""
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    return render_span(seconds)


def _instant(at: datetime | float | str | None) -> datetime | None:
    seconds = at.timestamp() if isinstance(at, datetime) else to_float(at, None)
    if seconds is None or seconds <= 0:
        return None
    try:
        return datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def when(at: datetime | float | str | None, now: float | None = None, full: bool = False) -> Markup:
    """A time on one line, as a ``<time>`` element: the UTC clock time when it is today
    (``14:58:07``), else the day too (``Dec 01 14:58``, or ``2025-12-01`` in another year),
    then how long ago or from now it is (``5.7s ago``, ``in 3h 1m``); the whole UTC date is
    its tooltip. ``full`` writes the whole date in place of the short one. ``-`` for no
    time, ``?`` for one that is not a plausible time."""
    if at is None:
        return Markup("-")
    instant = _instant(at)
    if instant is None:
        return Markup("?")
    ref = time.time() if now is None else now
    today = datetime.fromtimestamp(ref, UTC).date()
    whole = instant.strftime("%Y-%m-%d %H:%M:%S UTC")
    if full:
        shown = whole
    elif instant.date() == today:
        shown = instant.strftime("%H:%M:%S")
    elif instant.year == today.year:
        shown = instant.strftime("%b %d %H:%M")
    else:
        shown = instant.strftime("%Y-%m-%d")
    delta = ref - instant.timestamp()
    span = render_span(abs(delta))
    relative = f"{span} ago" if delta >= 0 else f"in {span}"
    return Markup('<time datetime="{}" title="{}">{} <small>{}</small></time>').format(
        instant.strftime("%Y-%m-%dT%H:%M:%SZ"), whole, shown, relative
    )


def reason(error: BaseException) -> str:
    """``Type: message`` on one line, secrets of a validation error left out
    (``aqw._redact``), and the type said once even when the message starts with it (as
    some clients' messages do: ``ConnectionError: ConnectionError: ...`` reads as one)."""
    text = redact_error(error)
    name = type(error).__name__
    doubled = f"{name}: {name}: "
    while text.startswith(doubled):
        text = text[len(name) + 2 :]
    return text
