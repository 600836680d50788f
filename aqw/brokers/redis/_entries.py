"""Reading aqw's own records back from Redis, tolerantly: stream entries as deliveries,
DLQ entries as dead jobs (a field that does not parse gets a default and a note, never a
crash), text that need not be UTF-8."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..._readback import shown, to_float, to_int
from ...job import Job
from ..base import DeadJob, Delivery


def text(value: Any) -> str:
    # "replace": a field written by someone else need not be UTF-8, and must not crash a read.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def decode_job(fields: dict[Any, Any] | None) -> Job | None:
    """The job in a stream entry's fields, or None when there is none or it does not decode."""
    data = fields.get(b"j") if fields else None
    if data is None:
        return None
    try:
        return Job.decode(data)
    except Exception:
        return None


def delivery_of(entry_id: Any, fields: dict[Any, Any], delivered: int = 1) -> Delivery:
    data = fields.get(b"j")
    if data is None:  # an entry written by someone else: keep it all, so the DLQ shows it
        data = repr({text(k): v for k, v in fields.items()}).encode()
    return Delivery(id=text(entry_id), data=data, delivery_count=delivered)


def dead_job_of(entry_id: Any, fields: dict[Any, Any]) -> DeadJob:
    """A DLQ entry as a DeadJob; numbers that do not parse get defaults and a note
    (``DeadJob.damaged``)."""
    f = {text(k): v for k, v in fields.items()}
    damaged: list[str] = []

    def number(name: str, parse: Callable[[Any, None], float | None], what: str) -> Any:
        raw = f.get(name)
        if raw is None or raw in (b"", ""):
            return 0
        value = parse(raw, None)
        if value is None or not 0 <= value <= 1e11:  # 1e11 s: the year 5138
            damaged.append(f"{name} {shown(raw)} is not {what}")
            return 0
        return value

    data = f.get("j", b"")
    values: dict[str, Any] = {
        "id": text(entry_id),
        "data": data if isinstance(data, bytes) else text(data).encode(),
        "task": text(f.get("task", b"")),
        "job_id": text(f.get("job_id", b"")),
        "error_type": text(f.get("error_type", b"")),
        "error": text(f.get("error", b"")),
        "traceback": text(f.get("tb", b"")),
        "attempts": int(number("attempts", to_int, "a count")),
        "first_failed_at": float(number("first", to_float, "a time")),
        "last_failed_at": float(number("last", to_float, "a time")),
        "worker": text(f.get("worker", b"")),
    }
    if damaged:
        return DeadJob(**values, damaged=tuple(damaged))
    return DeadJob(**values)
