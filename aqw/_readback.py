"""Tolerant reading of aqw's own state: values read back from a broker are not trusted.

Anyone who can write to the Redis server can put anything in aqw's keys: a DLQ entry whose
``attempts`` is ``"abc"``, a heartbeat that is not JSON, a stats counter that is not an
integer. ``aqw status``, ``aqw dlq`` and the monitor read those values through the parsers
here: a bad value becomes a default plus a note naming the damage, never an exception.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, TypeVar

T = TypeVar("T")

#: ``kind`` of the placeholder a broker returns for a heartbeat it could not read.
DAMAGED_KIND = "damaged"

#: Largest magnitude accepted for an integer field (a signed 64-bit Redis integer).
INT_LIMIT = 2**63 - 1

_INT_TEXT = re.compile(r"-?[0-9]{1,19}")
_FLOAT_TEXT_MAX = 64  # characters; repr() of any double is shorter


def to_int(value: Any, default: T) -> int | T:
    """``value`` as an int (a JSON/Lua integer, or its decimal text), else ``default``."""
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value if -INT_LIMIT <= value <= INT_LIMIT else default
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer() and abs(value) <= INT_LIMIT:
            return int(value)
        return default
    if isinstance(value, bytes | bytearray):
        try:
            value = bytes(value).decode("ascii")
        except UnicodeDecodeError:
            return default
    if isinstance(value, str) and _INT_TEXT.fullmatch(value):
        n = int(value)
        return n if -INT_LIMIT <= n <= INT_LIMIT else default
    return default


def to_float(value: Any, default: T) -> float | T:
    """``value`` as a finite float (a number, or its text), else ``default``."""
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return float(value) if -INT_LIMIT <= value <= INT_LIMIT else default
    if isinstance(value, float):
        return value if math.isfinite(value) else default
    if isinstance(value, bytes | bytearray):
        try:
            value = bytes(value).decode("ascii")
        except UnicodeDecodeError:
            return default
    if isinstance(value, str) and 0 < len(value) <= _FLOAT_TEXT_MAX:
        try:
            f = float(value)
        except ValueError:
            return default
        return f if math.isfinite(f) else default
    return default


def parse_json(value: Any) -> tuple[Any, str | None]:
    """``(data, None)`` for valid JSON text, ``(None, why)`` otherwise. ``NaN`` and
    ``Infinity`` (which Python accepts and JSON does not) are refused."""

    def refuse(token: str) -> Any:
        raise ValueError(f"{token} is not JSON")

    try:
        return json.loads(value, parse_constant=refuse), None
    except (ValueError, TypeError, RecursionError) as exc:
        return None, f"not JSON ({type(exc).__name__})"


def shown(value: Any, limit: int = 40) -> str:
    """A short, escaped ``repr`` of a bad value, for a damage note."""
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("utf-8", "replace")
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        text = text[:limit] + "..."
    return repr(text)


# -- dead-letter entries ----------------------------------------------------------------------


# -- running-job states -----------------------------------------------------------------------

#: Fields of a published job state that hold numbers (``aqw.worker._running.Run.state``).
JOB_STATE_NUMBERS = {
    "started_at": "float",
    "lease_expires_at": "float",
    "attempt": "int",
    "fencing_token": "int",
}


def check_job_state(state: dict[str, str]) -> dict[str, str]:
    """``state`` with a ``damaged`` note added when one of its numbers does not parse."""
    notes = []
    for name, kind in JOB_STATE_NUMBERS.items():
        value = state.get(name)
        if value is None or value == "":
            continue
        ok = to_int(value, None) if kind == "int" else to_float(value, None)
        if ok is None:
            notes.append(
                f"{name} {shown(value)} is not {'an integer' if kind == 'int' else 'a number'}"
            )
    if notes:
        return {**state, "damaged": "; ".join(notes)}
    return state


# -- heartbeats --------------------------------------------------------------------------------


def damaged_heartbeat(worker: str, reason: str) -> dict[str, Any]:
    """The placeholder for the heartbeat of ``worker`` that could not be read."""
    return {"kind": DAMAGED_KIND, "worker": worker, "damaged": reason}


def _is_number(value: Any) -> bool:
    return to_float(value, None) is not None and not isinstance(value, str | bytes)


def _is_int(value: Any) -> bool:
    return to_int(value, None) is not None and not isinstance(value, str | bytes)


def _optional(value: Any, check: Any) -> bool:
    return value is None or bool(check(value))


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _what(value: Any) -> str:
    return "missing" if value is None else shown(value)


def _records(beat: dict[str, Any], name: str, fields: dict[str, Any]) -> str | None:
    """None when ``beat[name]`` is absent or a list of objects whose ``fields`` pass."""
    items = beat.get(name)
    if items is None:
        return None
    if not isinstance(items, list):
        return f"{name!r} is not a list"
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            return f"{name}[{i}] is not an object"
        for field, check in fields.items():
            if not check(item.get(field)):
                return f"{name}[{i}].{field} is {_what(item.get(field))}"
    return None


_BEAT_NUMBERS = ("at", "started_at", "interval")
_BEAT_INTS = ("pid", "concurrency", "in_flight", "leases")
_BEAT_STRINGS = ("worker", "monitor", "queue", "kind")  # and a worker's "state"
_BEAT_COUNTS = ("last_1m", "last_5m", "totals")


def _str_or_none(v: Any) -> bool:
    return _optional(v, _is_str)


def _num_or_none(v: Any) -> bool:
    return _optional(v, _is_number)


def _required_str(v: Any) -> bool:
    return isinstance(v, str)


_STUCK = {
    "job_id": _required_str,
    "task": _str_or_none,
    "worker": _str_or_none,
    "sla": _num_or_none,
    "started_at": _num_or_none,
}
_ERRORS = {
    "fingerprint": _str_or_none,
    "error_type": _str_or_none,
    "task": _str_or_none,
    "message": _str_or_none,
    "count": lambda v: _optional(v, _is_int),
    "last_seen": _num_or_none,
}
_ALERTS = {
    "rule": _required_str,
    "queue": _required_str,
    "severity": _required_str,
    "summary": _required_str,
    "details": lambda v: isinstance(v, dict),
    "fired_at": _is_number,
    "resolved_at": _num_or_none,
    "key": _str_or_none,
}


def heartbeat_damage(beat: Any) -> str | None:
    """Why ``beat`` cannot be used as a worker's (or a monitor's) heartbeat, or None.

    Checks the shape ``aqw.worker._heartbeat.summary`` and ``Monitor._publish`` write: names are
    strings, numbers are finite JSON numbers, counters are integers, lists hold objects."""
    if not isinstance(beat, dict):
        return f"not a JSON object ({type(beat).__name__})"
    if beat.get("kind") == DAMAGED_KIND:
        return str(beat.get("damaged") or "damaged")
    is_monitor = beat.get("kind") == "monitor"
    for name in _BEAT_STRINGS if is_monitor else (*_BEAT_STRINGS, "state"):
        if not _str_or_none(beat.get(name)):
            return f"{name!r} is {shown(beat.get(name))}, not a string"
    name_field = "monitor" if is_monitor else "worker"
    if not isinstance(beat.get(name_field), str):
        return f"{name_field!r} is missing"
    for name in _BEAT_NUMBERS:
        if not _num_or_none(beat.get(name)):
            return f"{name!r} is {shown(beat.get(name))}, not a number"
    for name in _BEAT_INTS:
        if not _optional(beat.get(name), _is_int):
            return f"{name!r} is {shown(beat.get(name))}, not an integer"
    for name in (*_BEAT_COUNTS, "duration_5m"):
        counts = beat.get(name)
        if counts is None:
            continue
        if not isinstance(counts, dict):
            return f"{name!r} is not an object"
        check = _is_number if name == "duration_5m" else _is_int
        for key, value in counts.items():
            if not check(value):
                return f"{name}.{key} is {shown(value)}"
    runaway = beat.get("runaway")
    if runaway is not None and not (
        isinstance(runaway, list) and all(isinstance(t, str) for t in runaway)
    ):
        return "'runaway' is not a list of task names"
    problem = _records(beat, "stuck", _STUCK) or _records(beat, "errors", _ERRORS)
    if problem is None and is_monitor:
        problem = _records(beat, "alerts", _ALERTS)
        state = beat.get("state")
        if problem is None and state is not None:
            if not isinstance(state, dict):
                problem = "'state' is not an object"
            else:
                for name in ("baseline", "since", "at", "above_since"):
                    if not _num_or_none(state.get(name)):
                        problem = f"state.{name} is {shown(state.get(name))}"
                        break
    return problem


def beat_name(beat: Any) -> str:
    """The name a heartbeat gives itself (worker or monitor), for a damage note."""
    if isinstance(beat, dict):
        for field in ("worker", "monitor"):
            name = beat.get(field)
            if isinstance(name, str):
                return name
    return "(unnamed)"


def split_heartbeats(beats: list[Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """``(usable heartbeats, damage notes)``: each damaged one is left out and noted as
    ``damaged heartbeat from worker X: why``."""
    good: list[dict[str, Any]] = []
    notes: list[str] = []
    for beat in beats:
        problem = heartbeat_damage(beat)
        if problem is None:
            good.append(beat)
        else:
            notes.append(f"damaged heartbeat from worker {beat_name(beat)}: {problem}")
    return good, notes
