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

import atexit
import copy
import logging
import logging.handlers
import queue
import sys
import threading
import time
from typing import IO, Any

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

    _second = -1
    _shown = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """The time of ``DATE_FORMAT`` (whole seconds), made once a second, not per line."""
        second = int(record.created)
        if second != self._second:
            self._shown = time.strftime(datefmt or DATE_FORMAT, self.converter(second))
            self._second = second
        return self._shown

    def formatMessage(self, record: logging.LogRecord) -> str:
        prefix = job_prefix(record)
        if not prefix:
            return super().formatMessage(record)
        # the record's values with the message shown so (other handlers format the same
        # record: it is not changed)
        message = f"{prefix} {without_lead_in(record.message, record)}"
        if type(self._style) is logging.PercentStyle and not getattr(
            self._style, "_defaults", None
        ):
            return self._fmt % {**record.__dict__, "message": message}  # type: ignore[operator]
        shown = copy.copy(record)
        shown.message = message
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


#: Argument types a record can keep until the writer thread formats it: values that cannot
#: change after the call. A record with any other argument has its message made now.
PLAIN_ARGS = frozenset({str, int, float, bool, type(None), bytes})

#: Record attributes a ``text`` pattern may name that cost work on every record made: when
#: the pattern names none, records are made without them (see ``Background``).
COSTLY_ATTRS = (
    "pathname", "filename", "module", "lineno", "funcName", "thread", "threadName",
    "process", "processName",
)  # fmt: skip


class Deferred(logging.handlers.QueueHandler):
    """Hands each record to the writer thread as it is: the line is formatted and written
    there, off the event loop. Arguments that could change after the call (anything but
    plain values) are made into the message here first, so the line says what was logged."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        args = record.args
        if args:
            values = args.values() if isinstance(args, dict) else args
            if any(type(v) not in PLAIN_ARGS for v in values):
                record.msg, record.args = record.getMessage(), None
        return record


class Unflushed(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes without flushing: its listener flushes once the lines
    queued so far are written (one write to the stream per burst, not one per line)."""

    def flush(self) -> None:
        pass

    def flush_now(self) -> None:
        super().flush()


class Listener(logging.handlers.QueueListener):
    """Flushes its handler whenever it has written every record queued so far."""

    def dequeue(self, block: bool) -> logging.LogRecord:
        q: queue.SimpleQueue[Any] = self.queue  # type: ignore[assignment]
        if block and q.empty():
            for handler in self.handlers:
                if isinstance(handler, Unflushed):
                    handler.flush_now()
        record: logging.LogRecord = q.get(block)
        return record

    def stop(self) -> None:
        super().stop()
        for handler in self.handlers:
            if isinstance(handler, Unflushed):
                handler.flush_now()


class Background:
    """The writer thread of a background handler (``configure_logging(background=True)``):
    a ``QueueListener`` in front of the real handler, drained and stopped at exit (or by
    ``flush_logging``), after which records are written directly again."""

    current: Background | None = None

    def __init__(self, target: logging.Handler, pattern: str | None, fmt: str) -> None:
        self.target = target
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.handler = Deferred(self.queue)
        self.listener = Listener(self.queue, target)
        self.lock = threading.Lock()
        self.trimmed: dict[str, Any] = {}
        if fmt == "text" and not any(f"%({a})" in (pattern or TEXT_FORMAT) for a in COSTLY_ATTRS):
            # records made without the caller's frame, thread and process: none is shown
            self.trimmed = {
                "_srcfile": logging._srcfile,
                "logThreads": logging.logThreads,
                "logProcesses": logging.logProcesses,
                "logMultiprocessing": logging.logMultiprocessing,
            }
            logging._srcfile = None
            logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
        self.listener.start()

    def stop(self, root: logging.Logger) -> None:
        """Write what is queued, then write directly (the target takes the handler's place
        on ``root`` when it is still there)."""
        with self.lock:
            if Background.current is not self:
                return
            Background.current = None
        if self.handler in root.handlers:
            root.addHandler(self.target)
            root.removeHandler(self.handler)
        self.listener.stop()
        for name, value in self.trimmed.items():
            setattr(logging, name, value)


def flush_logging() -> None:
    """Write every line logged so far and stop the writer thread of a background handler
    (later lines are written directly). Called at exit; a no-op without one."""
    current = Background.current
    if current is not None:
        current.stop(logging.getLogger())


atexit.register(flush_logging)


def configure_logging(
    level: str,
    fmt: str,
    *,
    stream: IO[str] | None = None,
    pattern: str | None = None,
    force: bool = False,
    background: bool = False,
) -> None:
    """Log records of ``level`` and above to ``stream`` (stderr) as ``fmt`` (``text`` or
    ``json``), through one handler on the root logger (replacing the one a previous call
    installed). Like ``logging.basicConfig``, nothing is done when the root logger already
    has other handlers (the program configured logging itself), unless ``force``.
    ``pattern``: the ``text`` line, instead of ``TEXT_FORMAT``. ``background``: the lines
    are formatted and written by a thread of their own (as ``aqw`` commands do), so that a
    worker's line per job costs its event loop only the record (``flush_logging`` writes
    what is queued; it runs at exit).

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
    flush_logging()  # a previous background handler's lines first
    ours = [h for h in root.handlers if h.get_name() == HANDLER_NAME]
    where = sys.stderr if stream is None else stream
    target = Unflushed(where) if background else logging.StreamHandler(where)
    target.set_name(HANDLER_NAME)
    handler: logging.Handler = target
    if background:
        Background.current = writer = Background(target, pattern, fmt)
        handler = writer.handler
        handler.set_name(HANDLER_NAME)
    if fmt == "json":
        target.setFormatter(json_formatter())
        handler.addFilter(TraceIds())  # where the record is made: the span is current there
    else:
        target.setFormatter(TextFormatter(pattern))
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
