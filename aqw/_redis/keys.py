"""Every Redis key aqw writes is named here.

All keys of one queue share the hash tag ``{queue}``, so each Lua script touches one slot
and the same scripts run on Redis Cluster. Partition ``i`` of a partitioned queue
(``aqw/brokers/redis/_partitioned.py``) has the tag ``{queue:i}`` instead: the same layout in a
slot of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._text import quoted
from ..errors import ConfigError

PREFIX = "aqw"
GROUP = "aqw"


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """Key names of one queue (of one of its partitions when ``partition`` is set)."""

    queue: str
    partition: int | None = None
    #: ``aqw:{queue}`` (``aqw:{queue:i}`` for a partition): every key starts so. Made once:
    #: per-job key names are built from it on the job path.
    tag: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.partition is None:
            tag = f"{PREFIX}:{{{self.queue}}}"
        else:
            tag = f"{PREFIX}:{{{self.queue}:{self.partition}}}"
        object.__setattr__(self, "tag", tag)

    @property
    def stream(self) -> str:
        return f"{self.tag}:stream"

    @property
    def delayed(self) -> str:
        return f"{self.tag}:delayed"

    def stream_for(self, level: int) -> str:
        """The stream of priority level ``level``: level 0 is ``stream`` itself, others
        ``aqw:{q}:stream:p<level>``."""
        return f"{self.tag}:stream:p{level}" if level else f"{self.tag}:stream"

    def delayed_for(self, level: int) -> str:
        """The delayed set of priority level ``level`` (a job due later, a retry or any job
        put off waits here, then goes back to its level's stream): level 0 is ``delayed``."""
        return f"{self.tag}:delayed:p{level}" if level else f"{self.tag}:delayed"

    @property
    def levels(self) -> str:
        """The set of the priority levels above 0 that producers have used on this queue
        (``aqw/brokers/redis/_priorities.py``): what workers read besides level 0."""
        return f"{self.tag}:levels"

    @property
    def dlq(self) -> str:
        return f"{self.tag}:dlq"

    @property
    def fence(self) -> str:
        return f"{self.tag}:fence"

    @property
    def stats(self) -> str:
        return f"{self.tag}:stats"

    @property
    def schedule(self) -> str:
        """The hash of the periodic tasks' schedule marks: task -> "<tick> <job id>"."""
        return f"{self.tag}:schedule"

    @property
    def depth(self) -> str:
        """The depth history: a ZSET of "<bucket> <waiting> <in flight> <delayed> <dead>"
        scored by bucket start (``depth_sample.lua``, one per bucket, trimmed)."""
        return f"{self.tag}:depth"

    def lease(self, job_id: str) -> str:
        return f"{self.tag}:lease:{job_id}"

    def lock(self, name: str) -> str:
        return f"{self.tag}:lock:{name}"

    def rate(self, bucket: str) -> str:
        """The GCRA state of rate bucket ``bucket`` (``<task>[:<key>]``, ``job_start.lua``
        builds the same name); it expires once idle."""
        return f"{self.tag}:rate:{bucket}"

    def slots(self, key: str) -> str:
        """The holders of per-key cap ``key``: a ZSET of their lease key names
        (``job_start.lua`` builds the same name; it lives as long as its longest lease)."""
        return f"{self.tag}:slots:{key}"

    def done(self, key: str) -> str:
        """The completion record of idempotency key ``key``."""
        return f"{self.tag}:done:{key}"

    def idempotency(self, key: str) -> str:
        """The enqueue record of idempotency key ``key``."""
        return f"{self.tag}:key:{key}"

    def debounce(self, key: str) -> str:
        """The record of debounce key ``key``'s waiting job: a hash of its id, its member
        in the delayed set and its burst's first enqueue (``debounce.lua``)."""
        return f"{self.tag}:debounce:{key}"

    @property
    def running(self) -> str:
        """The index of running jobs: job ids scored by start time (``job_start.lua`` adds
        them, the settle scripts remove them)."""
        return f"{self.tag}:running"

    def job_state(self, job_id: str) -> str:
        """The record of job ``job_id`` (a hash of ``aqw.record.FIELDS``): its state from
        enqueue to its end, the running state included. Same key as ``record``."""
        return f"{self.tag}:job:{job_id}"

    def record(self, job_id: str) -> str:
        """The record of job ``job_id`` (``aqw/record.py``)."""
        return f"{self.tag}:job:{job_id}"

    def waiters(self, job_id: str) -> str:
        """The set of inboxes of the processes waiting for job ``job_id`` to end."""
        return f"{self.tag}:waiters:{job_id}"

    def inbox(self, name: str) -> str:
        """A waiting process's inbox: the list of the ids of awaited jobs that have ended."""
        return f"{self.tag}:inbox:{name}"

    @property
    def workers(self) -> str:
        """The set of worker names that published a heartbeat."""
        return f"{self.tag}:workers"

    def worker(self, name: str) -> str:
        """A worker's heartbeat (JSON, expires unless refreshed)."""
        return f"{self.tag}:worker:{name}"

    def pattern(self) -> str:
        """A SCAN pattern matching every key of this queue (of this partition)."""
        return f"{self.tag}:*"


def queue_fence_of(key: str) -> str:
    """The fencing counter of a lease on ``key`` when the key belongs to a queue
    (``aqw:{<tag>}:...``: its queue's or partition's ``aqw:{<tag>}:fence``, in its slot), else
    ``{<key>}:fence`` (in the key's slot too)."""
    head, brace, _ = key.partition("}")
    if brace and head.startswith(f"{PREFIX}:{{"):
        return f"{head}}}:fence"
    return f"{{{key}}}:fence"


def validate_queue_name(name: str) -> str:
    """Queue names become part of key names: keep them printable and brace-free."""
    if not name or len(name) > 200 or any(c in name for c in "{}\n\r\t ") or not name.isprintable():
        raise ConfigError(
            f"invalid queue name {quoted(name)}: use 1-200 printable characters without "
            "spaces or braces"
        )
    return name
