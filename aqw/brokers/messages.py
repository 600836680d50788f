"""What a broker hands out and takes back: deliveries, queue depths, failures, finishes and
dead-letter entries. Plain values, shared by every broker and the runtime."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

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
