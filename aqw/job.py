"""The job envelope: what travels through a broker, as versioned JSON."""

from __future__ import annotations

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


class Job(BaseModel):
    """One unit of work: a task name, its payload and delivery metadata.

    ``attempt`` counts runs: the first run is attempt 1. ``key`` is the idempotency key
    the producer gave, if any. ``headers`` carries trace context (``traceparent``,
    ``tracestate``) and any other string metadata.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")
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

    def encode(self) -> bytes:
        """The wire form: compact UTF-8 JSON, made once per job (the size check and the
        broker share it): a job's headers must not change once it has been encoded."""
        try:  # the slot itself: a miss on ``self._wire`` would go through pydantic
            return _WIRE.__get__(self, Job)  # type: ignore[no-any-return]
        except AttributeError:
            pass
        # The serializer itself: bytes at once, without ``model_dump_json``'s str round trip.
        wire: bytes
        if self.priority:
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
