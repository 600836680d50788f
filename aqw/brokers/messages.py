"""What a broker hands out and takes back: deliveries, queue depths, failures, finishes,
dead-letter entries, depth samples, delayed jobs, schedule marks and cancel outcomes. Plain
values, shared by every broker, its parts and the runtime."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from ..job import Job
from ..record import DEFAULT_KEEP_FOR


@dataclass(slots=True)
class Delivery:
    """One message handed to this worker. ``job`` is None until decoded."""

    id: str
    data: bytes
    delivery_count: int = 1
    receipt: Any = None
    attributes: dict[str, str] = field(default_factory=dict)
    #: (start, end) of the fetch that delivered it, in ns, when tracing is on.
    received: tuple[int, int] | None = None
    #: The priority level it was read from: its settle steps act on that level's stream.
    level: int = 0


@dataclass(slots=True, frozen=True)
class QueueDepth:
    """How much work a queue holds, by state."""

    waiting: int
    in_flight: int
    delayed: int
    dead: int

    def as_dict(self) -> dict[str, int]:
        return {n: getattr(self, n) for n in ("waiting", "in_flight", "delayed", "dead")}

    @classmethod
    def total(cls, depths: Iterable[QueueDepth]) -> QueueDepth:
        """The depths of several queues (or partitions) added up."""
        parts = list(depths)
        return cls(
            sum(d.waiting for d in parts),
            sum(d.in_flight for d in parts),
            sum(d.delayed for d in parts),
            sum(d.dead for d in parts),
        )


def total_counters(each: Iterable[dict[str, int]]) -> dict[str, int]:
    """Several brokers' counters (``Broker.stats``) added up, name by name."""
    out: dict[str, int] = {}
    for counters in each:
        for name, value in counters.items():
            out[name] = out.get(name, 0) + value
    return out


@dataclass(slots=True, frozen=True)
class Failure:
    """Why a job is being dead-lettered or retried."""

    error_type: str
    error: str
    traceback: str = ""
    worker: str = ""
    first_failed_at: float = 0.0
    failed_at: float = 0.0
    #: The error's fingerprint (``aqw status`` groups by it), recorded on the job's record.
    fingerprint: str = ""


@dataclass(slots=True, frozen=True)
class Finish:
    """How an ack leaves the job's record: its final state, how long the record lives, and
    the result (JSON text) or why none was kept, or the last error of a failed job."""

    state: str = "succeeded"  # "succeeded" | "failed" | "cancelled" | "expired"
    keep_for: float = DEFAULT_KEEP_FOR
    result: str | None = None
    note: str = ""
    failure: Failure | None = None

    def fields(self, worker: str, finished_at: float) -> dict[str, str]:
        """The record fields this finish writes (besides ``state``)."""
        out = {"finished_at": repr(finished_at), **({"worker": worker} if worker else {})}
        if self.result is not None:
            out["result"] = self.result
        if self.note:
            out["result_note"] = self.note
        if self.failure is not None:
            out.update(failure_fields(self.failure))
        return out


#: The finish of a plain success: what ``Broker.ack`` uses when given none.
SUCCEEDED = Finish()


def failure_fields(failure: Failure) -> dict[str, str]:
    """The record fields of a job's last error."""
    return {
        "error_type": failure.error_type,
        "error": failure.error,
        "fingerprint": failure.fingerprint,
        "traceback": failure.traceback,
    }


@dataclass(slots=True, frozen=True)
class DeadJob:
    """One entry of a dead-letter queue."""

    id: str
    data: bytes
    task: str
    error_type: str
    error: str
    traceback: str
    attempts: int
    first_failed_at: float
    last_failed_at: float
    worker: str
    job_id: str
    #: Fields of a stored entry that could not be read: they got defaults (``aqw dlq list``
    #: and ``show`` print these notes).
    damaged: tuple[str, ...] = ()

    @property
    def job(self) -> Job | None:
        """The original job, or None when the message could not be decoded."""
        try:
            return Job.decode(self.data)
        except Exception:
            return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "task": self.task,
            "job_id": self.job_id,
            "error_type": self.error_type,
            "error": self.error,
            "traceback": self.traceback,
            "attempts": self.attempts,
            "first_failed_at": self.first_failed_at,
            "last_failed_at": self.last_failed_at,
            "worker": self.worker,
            "data": self.data.decode("utf-8", "replace"),
            **({"damaged": list(self.damaged)} if self.damaged else {}),
        }


#: What ``JobRecords.cancel`` did: ``"cancelled"`` (not started: it never will),
#: ``"cancelling"`` (running: stopped at its next lease renewal), ``"finished"`` (it had
#: ended: nothing changes) or ``"unknown"`` (no record of it).
CancelOutcome = Literal["cancelled", "cancelling", "finished", "unknown"]


class ScheduleMark(NamedTuple):
    """A periodic task's last tick handled (seconds since the epoch), and the id of the job
    last enqueued for it ("" when none is known)."""

    tick: float
    job_id: str = ""

    def encode(self) -> str:
        return f"{self.tick!r} {self.job_id}".rstrip()

    @classmethod
    def decode(cls, text: str) -> ScheduleMark | None:
        """The mark stored as ``text``; None when it does not parse."""
        tick, _, job_id = text.strip().partition(" ")
        try:
            return cls(float(tick), job_id)
        except ValueError:
            return None


#: Seconds of one depth sample: however many workers beat, a queue gets one per bucket.
DEPTH_BUCKET = 10
#: Seconds of depth history kept (older samples are trimmed as new ones are written).
DEPTH_KEEP = 7200
#: Most samples a history holds (``DEPTH_KEEP / DEPTH_BUCKET``).
DEPTH_SAMPLES = DEPTH_KEEP // DEPTH_BUCKET


def bucket_of(at: float) -> int:
    """The start of the depth bucket holding ``at``."""
    return int(at) // DEPTH_BUCKET * DEPTH_BUCKET


class DepthSample(NamedTuple):
    """A queue's depth at the start of one bucket (seconds since the epoch)."""

    at: float
    waiting: int
    in_flight: int
    delayed: int
    dead: int

    def encode(self) -> str:
        return f"{int(self.at)} {self.waiting} {self.in_flight} {self.delayed} {self.dead}"

    @classmethod
    def decode(cls, text: str) -> DepthSample | None:
        """The sample stored as ``text``; None when it does not parse."""
        parts = text.split()
        if len(parts) != 5:
            return None
        try:
            at, *counts = (int(p) for p in parts)
        except ValueError:
            return None
        return cls(float(at), *counts)


class DelayedJob(NamedTuple):
    """One member of the delayed set: the job's wire form and when it is due (seconds since
    the epoch, on every broker)."""

    due: float
    data: bytes


#: What ``ServerInfo.release_lease`` did.
Released = Literal["released", "no lease", "held", "changed", "unsupported"]


@dataclass(frozen=True, slots=True)
class BlockedLease:
    """A job blocked by a lease key that no live worker holds (damaged or forged state:
    crash recovery waits for a job's lease key to go, so such a key blocks it for ever)."""

    job_id: str
    #: The lease key's value: the token of the unknown holder (as stored, maybe not text).
    token: bytes
    #: Seconds its delivery has been pending untouched.
    held_for: float

    def problem(self, target: str) -> str:
        """The line ``aqw status`` prints (``target``: the options naming the app)."""
        return (
            f"job {self.job_id}: lease key held by an unknown token for {self.held_for:.0f} s; "
            f"clear it with `aqw job release {target} {self.job_id}`"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "token": self.token.decode("utf-8", "replace"),
            "held_for": round(self.held_for, 1),
        }


@dataclass(frozen=True, slots=True)
class Release:
    """What ``ServerInfo.release_lease`` did: ``outcome``, the token seen, and for ``held``
    the live holder and how long its lease has left."""

    outcome: Released
    token: bytes = b""
    worker: str = ""
    expires_in: float = 0.0


@dataclass(frozen=True, slots=True)
class WaitingJob:
    """One waiting job as the waiting list shows it: its entry id (what ``delete_waiting``
    takes), its priority level and its wire form."""

    entry_id: str
    level: int
    data: bytes
