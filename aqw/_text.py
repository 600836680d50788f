"""Text read from a broker, made safe to print on an operator's terminal.

Task names, error messages, tracebacks, worker names and payloads come from Redis (or SQS),
where anyone with write access can store anything, terminal escape sequences included
(``"\\x1b[2J"`` clears the screen, others retitle windows or fake output). Everything the
command line prints from there goes through :func:`printable`.
"""

from __future__ import annotations

_KEPT = "\n\t"
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: object, keep_newlines: bool = False) -> str:
    """``text`` with every non-printable character escaped as ``\\n``, ``\\r``, ``\\t``,
    ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``: C0 controls (ESC, CR, BEL, ...), DEL, C1
    controls and the other characters ``str.isprintable`` rejects (bidirectional overrides,
    zero-width marks).
    ``keep_newlines`` keeps ``\\n`` and ``\\t`` as they are (for tracebacks)."""
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():
        return s
    return "".join(_escape(c, keep_newlines) for c in s)


def _escape(c: str, keep_newlines: bool) -> str:
    if c.isprintable() or (keep_newlines and c in _KEPT):
        return c
    if c in _SHORT:
        return _SHORT[c]
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


#: The most characters of a caller's value an error message repeats (``quoted``).
QUOTED_CHARS = 200


def quoted(value: object, limit: int = QUOTED_CHARS) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters with the length
    said after it (a 1 MB queue name or job id must not make a 1 MB error), and one line:
    ``repr`` escapes newlines and control characters of a string."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} chars)"
    if isinstance(value, bytes | bytearray) and len(value) > limit:
        return f"{bytes(value[:limit])!r}... ({len(value)} bytes)"
    try:
        text = repr(value)
    except Exception as exc:  # a value whose repr fails still gets a message
        text = f"<{type(value).__name__} whose repr failed: {type(exc).__name__}>"
    if len(text) > limit:
        text = text[:limit] + f"... ({type(value).__name__})"
    return text.replace("\n", "\\n")


def error_line(exc: BaseException, limit: int = QUOTED_CHARS) -> str:
    """``Type: the first line of its message``, the message cut to ``limit`` characters:
    an error of a library (pydantic's, a codec's) as one short line of an aqw error."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    if len(text) > limit:
        text = text[:limit] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def plural(count: int, word: str, words: str | None = None) -> str:
    """``1 job``, ``2 jobs``: ``count`` and ``word``, or ``words`` (default ``word + "s"``)
    when ``count`` is not 1."""
    return f"{count} {word if count == 1 else (words or word + 's')}"
