"""The log lines of ``aqw`` commands: ``--log-format text|json`` (``AQW_LOG_FORMAT``).

Only the command line installs a handler. Embedded in another program (a FastAPI app under
uvicorn, a script), aqw adds none: its loggers (``aqw.worker``, ``aqw.job`` for ``ctx.log``,
...) propagate to whatever the host configured, and records about a job carry ``job_id``,
``task`` and ``attempt`` as attributes for the host's formatter to use.

- ``text``: ``2026-12-01 10:00:00 INFO aqw.worker job=... task=... attempt=1 succeeded in
  3.2 ms``: the job's fields after the logger name, and the message without the ``job <id>
  (<task>) attempt <n>`` it starts with (the fields say it already).
- ``json``: one JSON object per line (python-json-logger): ``time``, ``level``, ``logger``,
  ``message``, every ``extra`` field of the record (``job_id``, ``task``, ``attempt``,
  ``duration_ms``, ``dlq_entry``, ``blocked_s``...), ``exc_info`` when there is one, and
  ``trace_id``/``span_id`` (hex) when an OpenTelemetry span is current.
"""

from __future__ import annotations

import copy
import logging
import sys
from typing import IO

from opentelemetry import trace

try:
    from pythonjsonlogger.json import JsonFormatter
except ImportError:  # pragma: no cover - python-json-logger 2.x
    from pythonjsonlogger.jsonlogger import (  # type: ignore[attr-defined]
        JsonFormatter,
    )

#: The values of ``--log-format``.
LOG_FORMATS = ("text", "json")

#: The text line (``%`` style); the job's fields are put in front of the message.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

#: The time in a text line.
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"

#: The record attributes that say which job a line is about, and their labels in a text
#: line, in the order they are shown.
JOB_FIELDS = (("job_id", "job"), ("task", "task"), ("attempt", "attempt"))

#: The name of the handler ``configure_logging`` installs (and replaces when called again).
HANDLER_NAME = "aqw-cli"


def job_prefix(record: logging.LogRecord) -> str:
    """``job=<id> task=<name> attempt=<n>`` of the fields the record has, or ''."""
    values = record.__dict__
    return " ".join(f"{label}={values[name]}" for name, label in JOB_FIELDS if name in values)


def without_lead_in(message: str, record: logging.LogRecord) -> str:
    """``message`` without a leading ``job <id> (<task>)`` and ``attempt <n>`` that repeat
    the record's own fields (``aqw.worker``'s lines start so, to read well without them)."""
    values = record.__dict__
    lead = f"job {values.get('job_id')} ({values.get('task')})"
    if not message.startswith(lead):
        return message
    rest = message[len(lead) :]
    attempt = f" attempt {values.get('attempt')}"
    if rest.startswith(attempt):
        rest = rest[len(attempt) :]
    rest = rest.removeprefix(":").lstrip(" ")
    return rest or message


class TextFormatter(logging.Formatter):
    """The ``text`` format: ``TEXT_FORMAT`` (or the given one) with the job's fields in
    front of the message when the record has them."""

    def __init__(self, fmt: str | None = None) -> None:
        super().__init__(fmt or TEXT_FORMAT, DATE_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        prefix = job_prefix(record)
        if not prefix:
            return super().formatMessage(record)
        shown = copy.copy(record)  # other handlers format the same record
        shown.message = f"{prefix} {without_lead_in(record.message, record)}"
        return super().formatMessage(shown)


class TraceIds(logging.Filter):
    """Adds ``trace_id`` and ``span_id`` (hex) to records logged while an OpenTelemetry span
    is current."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid and not hasattr(record, "trace_id"):
            record.trace_id = format(ctx.trace_id, "032x")
            record.span_id = format(ctx.span_id, "016x")
        return True


def json_formatter() -> logging.Formatter:
    """The ``json`` format: one object per line."""
    formatter: logging.Formatter = JsonFormatter(
        "%(levelname)s %(name)s %(message)s",
        rename_fields={"levelname": "level", "name": "logger"},
        timestamp="time",
    )
    return formatter


#: Loggers of libraries kept at WARNING or above whatever the level.
QUIET_LIBRARIES = ("aiobotocore", "botocore", "boto3", "urllib3")

#: redis-py's loggers of each new connection, and the start of the DEBUG line they write on
#: every connection to a server that predates ``CLIENT MAINT_NOTIFICATIONS`` (Redis < 8).
REDIS_CONNECTION_LOGGERS = ("redis.asyncio.connection", "redis.connection")
MAINT_NOTICE = "Failed to enable maintenance notifications"


class WithoutMaintNotice(logging.Filter):
    """Drops redis-py's "Failed to enable maintenance notifications: unknown subcommand
    'MAINT_NOTIFICATIONS'" line: said at DEBUG on every connection, it says only that the
    server is older than the client, and buries ``--log-level debug``'s own lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(MAINT_NOTICE))


def configure_logging(
    level: str,
    fmt: str,
    *,
    stream: IO[str] | None = None,
    pattern: str | None = None,
    force: bool = False,
) -> None:
    """Log records of ``level`` and above to ``stream`` (stderr) as ``fmt`` (``text`` or
    ``json``), through one handler on the root logger (replacing the one a previous call
    installed). Like ``logging.basicConfig``, nothing is done when the root logger already
    has other handlers (the program configured logging itself), unless ``force``.
    ``pattern``: the ``text`` line, instead of ``TEXT_FORMAT``.

    Raises ValueError (one line) for an unknown format or level."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"unknown log format {fmt!r} (choose {' or '.join(LOG_FORMATS)})")
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r} (DEBUG, INFO, WARNING, ERROR...)")
    root = logging.getLogger()
    ours = [h for h in root.handlers if h.get_name() == HANDLER_NAME]
    if len(ours) < len(root.handlers) and not force:
        return
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.set_name(HANDLER_NAME)
    if fmt == "json":
        handler.setFormatter(json_formatter())
        handler.addFilter(TraceIds())
    else:
        handler.setFormatter(TextFormatter(pattern))
    for old in ours:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    # Libraries that narrate their routine at INFO ("Found credentials in environment
    # variables.") would sit between a user's command and aqw's own lines.
    for chatty in QUIET_LIBRARIES:
        logging.getLogger(chatty).setLevel(max(numeric, logging.WARNING))
    for name in REDIS_CONNECTION_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, WithoutMaintNotice) for f in logger.filters):
            logger.addFilter(WithoutMaintNotice())
