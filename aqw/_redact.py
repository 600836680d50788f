"""Describing errors without the payload in them, for places that outlive a job and are read
by more people than its data: worker heartbeats (``aqw status``) and span events/statuses.

A pydantic ``ValidationError`` is the usual leak: its text repeats every bad input value
(``input_value='...'``). Here it becomes only the location and message of each error, as
``describe`` in ``worker/_handler.py`` does for logs and the dead-letter queue. Other
exceptions keep their message (which the handler's author wrote), made one line and
length-capped.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from pydantic import ValidationError

#: Longest text ``redact_error`` and ``redact_message`` return by default.
MAX_CHARS = 300

#: Errors of a ValidationError listed before "... and N more".
_MAX_ERRORS = 5

#: Exceptions of a ``__cause__``/``__context__`` chain ``redact_traceback`` follows.
_MAX_CHAIN = 10

#: aqw's own source directory: frames there above the user's code are left out.
_AQW_DIR = str(Path(__file__).resolve().parent) + os.sep

_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def redact_error(error: BaseException, limit: int = MAX_CHARS) -> str:
    """``Type: message`` on one line, at most ``limit`` characters, control characters
    escaped; a ``ValidationError`` lists only each error's location and message."""
    message = _message(error)
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    return one_line(text, limit)


def redact_message(error: BaseException, limit: int = MAX_CHARS) -> str:
    """The message part of ``redact_error`` (no type name), for records that keep the type
    apart: an error fingerprint, a span's ``exception.message``."""
    return one_line(_message(error), limit)


def redact_traceback(error: BaseException, limit: int = MAX_CHARS) -> str:
    """The traceback text of ``error`` and its chained causes with every exception's line
    replaced by ``redact_error``: frames (file, line, source) are kept, messages redacted,
    and aqw's own frames above the first frame of the user's code are left out."""
    return _format(error, lambda exc: redact_error(exc, limit) + "\n")


def user_traceback(error: BaseException) -> str:
    """The traceback text of ``error`` as Python prints it, less aqw's own frames above the
    first frame of the user's code (the worker's call into the handler)."""
    return _format(error, lambda exc: "".join(traceback.format_exception_only(exc)))


def _format(error: BaseException, line: Callable[[BaseException], str]) -> str:
    chain: list[BaseException] = []
    seen: set[int] = set()
    exc: BaseException | None = error
    while exc is not None and id(exc) not in seen and len(chain) < _MAX_CHAIN:
        seen.add(id(exc))
        chain.append(exc)
        if exc.__cause__ is not None:
            exc = exc.__cause__
        else:
            exc = None if exc.__suppress_context__ else exc.__context__
    out: list[str] = []
    for i in range(len(chain) - 1, -1, -1):  # the oldest first, as Python prints them
        exc = chain[i]
        if exc.__traceback__ is not None:
            out.append("Traceback (most recent call last):\n")
            out.extend(_frames(exc.__traceback__))
        out.append(line(exc))
        if i > 0:
            out.append(_CAUSE if chain[i - 1].__cause__ is exc else _CONTEXT)
    return "".join(out)


def _frames(tb: TracebackType) -> list[str]:
    """The frames of ``tb``, from the first that is not aqw's own (all of them when every
    frame is aqw's: an error of aqw itself)."""
    frames = traceback.extract_tb(tb)
    first = next((i for i, f in enumerate(frames) if not f.filename.startswith(_AQW_DIR)), 0)
    return traceback.format_list(frames[first:])


def one_line(text: str, limit: int = MAX_CHARS) -> str:
    """``text`` with control and other unprintable characters escaped (``\\n``, ``\\x1b``,
    ``\\u2028``), cut to at most ``limit`` characters."""
    head = text[:limit]  # escaping only lengthens: nothing past this can show
    if head.isprintable():
        return head
    out: list[str] = []
    size = 0
    for ch in head:
        piece = ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii")
        size += len(piece)
        if size > limit:
            break
        out.append(piece)
    return "".join(out)[:limit]


def _message(error: BaseException) -> str:
    if isinstance(error, ValidationError):
        try:
            errors = error.errors(include_url=False, include_input=False, include_context=False)
        except Exception:
            return "invalid input"
        parts = []
        for err in errors[:_MAX_ERRORS]:
            where = ".".join(str(p) for p in err["loc"]) or "payload"
            parts.append(f"{where}: {err['msg']}")
        more = len(errors) - len(parts)
        if more > 0:
            parts.append(f"... and {more} more")
        return "; ".join(parts)
    try:
        return str(error)
    except Exception:  # a broken __str__ must not break error reporting
        return "<unprintable message>"


#: Keys whose values a shown payload hides (``redact_payload``), matched in lower case
#: with ``-`` and ``_`` left out: any key containing one of these.
SECRET_KEYS = (
    "password",
    "passwd",
    "secret",
    "token",
    "apikey",
    "authorization",
    "credential",
    "privatekey",
    "cookie",
    "session",
)
#: What stands for a hidden value.
HIDDEN = "***"


def redact_payload(value: object, depth: int = 0) -> object:
    """``value`` (a decoded JSON payload) with the values of secret-looking keys
    (``SECRET_KEYS``: ``password``, ``api_key``, ``Authorization``...) replaced by ``***``,
    at any depth, for showing a payload to people (the dashboard)."""
    if depth > 50:
        return HIDDEN
    if isinstance(value, dict):
        return {k: HIDDEN if _secret(k) else redact_payload(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_payload(v, depth + 1) for v in value]
    return value


def _secret(key: object) -> bool:
    name = str(key).lower().replace("_", "").replace("-", "")
    return any(word in name for word in SECRET_KEYS)
