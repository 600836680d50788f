"""What a worker knows about the jobs it runs: its counters, and each running job's state
(what ``app.job_status`` and the stuck-job watchdog see)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..job import Job
from ..lease import Lease
from ..telemetry import JobTrace


@dataclass(slots=True)
class WorkerStats:
    """Counters of one worker since it started."""

    processed: int = 0
    failed: int = 0
    retried: int = 0
    dead: int = 0
    lease_lost: int = 0
    lease_busy: int = 0
    requeued: int = 0
    malformed: int = 0
    duplicates_skipped: int = 0
    stuck: int = 0

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


class RunningJob:
    """A job while it runs here: what ``app.job_status`` and the watchdog see."""

    __slots__ = ("job", "lease", "message", "progress", "published", "started", "trace")

    def __init__(self, job: Job, lease: Lease, trace: JobTrace) -> None:
        self.job = job
        self.lease = lease
        self.trace = trace
        self.started = time.time()
        self.progress = 0.0
        self.message = ""
        self.published = False

    def state(self, worker: str) -> dict[str, str]:
        return {
            "state": "running",
            "job_id": self.job.id,
            "task": self.job.task,
            "attempt": str(self.job.attempt),
            "worker": worker,
            "started_at": repr(self.started),
            "lease_expires_at": repr(self.lease.expires_at),
            "fencing_token": str(self.lease.fencing_token),
            "progress": repr(self.progress),
            "message": self.message,
        }


#: A job's running state is published once it has run this long (or reports progress),
#: so the many short jobs cost no extra round trips.
STATE_AFTER = 0.5


def vars_of(obj: Any) -> dict[str, Any]:
    """A slotted dataclass as a dict."""
    return {name: getattr(obj, name) for name in obj.__slots__}
