"""The job envelope: what travels through a broker, as versioned JSON."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ._ids import new_job_id, now
from .errors import MalformedJob

#: The envelope version this release writes and reads.
ENVELOPE_VERSION = 1
#: The priority levels of a job (``enqueue(priority=...)``): higher runs first.
MIN_PRIORITY = 0
MAX_PRIORITY = 9
_DEFAULT_PRIORITY = {"priority"}
#: Left out of the wire form of a job without a fairness key (and with priority 0).
_NOT_FAIR = {"fairness_key", "fairness_weight"}
_PLAIN_JOB = {"priority", "fairness_key", "fairness_weight"}
#: The most a fairness weight may be (``aqw.flow.MAX_WEIGHT``; the least is its inverse).
MAX_WEIGHT = 1_000_000.0


class Job(BaseModel):
    """One unit of work: a task name, its payload and delivery metadata.

    ``attempt`` counts runs: the first run is attempt 1. ``key`` is the idempotency key
    the producer gave, if any. ``headers`` carries trace context (``traceparent``,
    ``tracestate``) and any other string metadata.
    """

    #: ``ser_json_inf_nan="constants"``: a non-finite number in a payload is written as
    #: ``NaN``/``Infinity`` (not JSON), never quietly as ``null``, so the producer's check
    #: (``non_finite_in``) finds it in the wire form at the cost of a bytes search.
    model_config = ConfigDict(frozen=True, extra="ignore", ser_json_inf_nan="constants")
    #: The wire form once made (``encode``); a slot, so not a field and not carried over to
    #: a ``model_copy``.
    __slots__ = ("_wire",)

    v: Literal[1] = 1
    id: str = Field(default_factory=new_job_id, min_length=1, max_length=200)
    task: str = Field(min_length=1, max_length=200)
    payload: Any = None
    #: Runs so far plus one; bounded so that any attempt number survives a round trip.
    attempt: int = Field(default=1, ge=1, le=1_000_000_000)
    #: Finite: infinity would not survive the JSON round trip of a retry.
    enqueued_at: float = Field(default_factory=now, allow_inf_nan=False)
    headers: dict[str, str] = Field(default_factory=dict)
    key: str | None = Field(default=None, max_length=1000)
    #: Seconds since the epoch after which the job must not start (``enqueue(expires=...)``).
    expires_at: float | None = Field(default=None, allow_inf_nan=False)
    #: Priority level, ``MIN_PRIORITY`` to ``MAX_PRIORITY``: higher runs first. Left out of
    #: the wire form at the default, so a job without one reads as it always did.
    priority: int = Field(default=0, ge=MIN_PRIORITY, le=MAX_PRIORITY, strict=True)
    #: The key whose fair share the job is counted in (``fairness_key=``), and its weight;
    #: both left out of the wire form without a key.
    fairness_key: str | None = Field(default=None, min_length=1, max_length=200)
    fairness_weight: float = Field(
        default=1.0, ge=1 / MAX_WEIGHT, le=MAX_WEIGHT, allow_inf_nan=False
    )

    def encode(self) -> bytes:
        """The wire form: compact UTF-8 JSON, made once per job (the size check and the
        broker share it): a job's headers must not change once it has been encoded."""
        try:  # the slot itself: a miss on ``self._wire`` would go through pydantic
            return _WIRE.__get__(self, Job)  # type: ignore[no-any-return]
        except AttributeError:
            pass
        # The serializer itself: bytes at once, without ``model_dump_json``'s str round trip.
        wire: bytes
        if self.fairness_key is None:
            wire = _SERIALIZER.to_json(self, exclude=_NOT_FAIR if self.priority else _PLAIN_JOB)
        elif self.priority:
            wire = _SERIALIZER.to_json(self)
        else:
            wire = _SERIALIZER.to_json(self, exclude=_DEFAULT_PRIORITY)
        _WIRE.__set__(self, wire)
        return wire

    @classmethod
    def decode(cls, data: bytes | str) -> Job:
        """Parse the wire form, raising ``MalformedJob`` with a readable reason."""
        if isinstance(data, bytes):
            try:
                data = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise MalformedJob(f"message is not valid UTF-8: {exc}") from None
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            raise MalformedJob(_describe(exc)) from None

    def expired(self, at: float | None = None) -> bool:
        """True when the job has an expiry time and ``at`` (default: now) is past it."""
        return self.expires_at is not None and (now() if at is None else at) > self.expires_at

    def next_attempt(self) -> Job:
        """A copy for the next run (attempt + 1)."""
        return self.model_copy(update={"attempt": self.attempt + 1})


#: What a non-finite number looks like in a wire form (``-Infinity`` contains ``Infinity``).
NON_FINITE_MARKS = (b"NaN", b"Infinity")


def non_finite_in(wire: bytes, payload: Any) -> tuple[str, float] | None:
    """(where, the number) of the first non-finite number of ``payload``, the JSON-able
    payload of a job whose wire form is ``wire``; None when it has none. The wire is
    searched first (the marks can also be the text of a string): the walk runs only when
    one is there."""
    if not any(mark in wire for mark in NON_FINITE_MARKS):
        return None
    return non_finite_at(payload)


def has_non_finite(value: Any) -> bool:
    """True when ``value`` (dicts, lists, tuples and pydantic models, nested) holds a float
    that is nan or infinite: the quick look, without the paths ``non_finite_at`` builds."""
    kind = type(value)
    if kind is float:
        return not math.isfinite(value)
    if kind is dict:
        items: Any = value.values()
    elif kind is list or kind is tuple:
        items = value
    elif isinstance(value, BaseModel):
        extra = value.__pydantic_extra__
        return has_non_finite(value.__dict__) or (extra is not None and has_non_finite(extra))
    elif isinstance(value, dict | list | tuple):
        return has_non_finite(dict(value) if isinstance(value, dict) else list(value))
    else:
        return False
    return any(type(item) not in _PLAIN and has_non_finite(item) for item in items)


#: Types that hold no float: ``has_non_finite`` does not call itself for them.
_PLAIN = frozenset({str, int, bool, type(None)})


def non_finite_at(value: Any, where: str = "") -> tuple[str, float] | None:
    """(where, the number) of the first float that is nan or infinite in ``value`` (dicts,
    lists, tuples and pydantic models, nested), ``where`` a path like ``size.width`` or
    ``tags[1]`` (empty: ``value`` itself); None when there is none. Iterative: a deep value
    cannot exhaust the stack; a value met twice (a cycle) is walked once."""
    stack: list[tuple[str, Any]] = [(where, value)]
    seen: set[int] = set()
    while stack:
        path, item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return path, item
            continue
        if isinstance(item, BaseModel):
            item = {**item.__dict__, **(item.__pydantic_extra__ or {})}
        if isinstance(item, dict):
            children = [(f"{path}.{k}" if path else str(k), v) for k, v in item.items()]
        elif isinstance(item, list | tuple):
            children = [(f"{path}[{i}]", v) for i, v in enumerate(item)]
        else:
            continue
        if id(item) in seen:
            continue
        seen.add(id(item))
        stack.extend(reversed(children))  # the first child is looked at first
    return None


#: ``Job``'s ``_wire`` slot (its descriptor).
_WIRE: Any = Job.__dict__["_wire"]
#: ``Job``'s pydantic serializer (what ``model_dump_json`` calls).
_SERIALIZER: Any = Job.__pydantic_serializer__


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False)[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "message"
        parts.append(f"{where}: {err['msg']}")
    more = exc.error_count() - len(parts)
    if more > 0:
        parts.append(f"... and {more} more")
    return "invalid job envelope: " + "; ".join(parts)
