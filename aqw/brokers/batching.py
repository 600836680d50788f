"""The values of a batch (``app.batch``) a broker's ``BatchCounts`` part takes and hands out:
``BatchSpec`` (what opening a batch writes), ``BatchInfo`` (its counts, read back), the
callback kinds, the headers a batch's jobs carry and the outcome a child's final state
counts as.

A child counts once, in the same atomic step as its own settle, by its membership in the
batch's set of unfinished children (never a bare counter): a redelivered child that already
counted, or a stale holder's refused settle, counts nothing. The step that brings a sealed
batch to zero unfinished children enqueues its callbacks under the idempotency keys
``batch:<id>:<kind>``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from ..job import Job

__all__ = [
    "BATCH_HEADER",
    "BATCH_INFO_HEADER",
    "BATCH_INFO_SLOT",
    "CALLBACK_KINDS",
    "FLOW_INPUT_SLOT",
    "BatchInfo",
    "BatchSpec",
    "BatchState",
    "callback_key",
    "counted_as",
]

#: A child job's header: the id of the batch it counts in.
BATCH_HEADER = "aqw-batch"
#: A callback job's header: the batch's ``BatchInfo`` as JSON, as it was when the batch
#: completed (``ctx.batch``). Written into the job by the step that enqueues it.
BATCH_INFO_HEADER = "aqw-batch-info"
#: What that header holds until the completing step writes the counts in (the JSON string
#: literal is replaced in the job's wire form, nothing else is touched).
BATCH_INFO_SLOT = "@aqw-batch-info@"

#: A flow step's payload until the step that enqueues it writes its parents' results in
#: (the JSON string literal is replaced in the job's wire form).
FLOW_INPUT_SLOT = "@aqw-flow-input@"

#: The callbacks, in the order they are enqueued.
CALLBACK_KINDS = ("complete", "success", "failure")

BatchState = Literal["open", "sealed", "complete", "cancelled"]


def callback_key(batch_id: str, kind: str) -> str:
    """The idempotency key of a batch's callback job: one job per key, whatever happens."""
    return f"batch:{batch_id}:{kind}"


def counted_as(state: str) -> str:
    """The count a child's final state goes into: succeeded, failed (dead or failed),
    cancelled or expired."""
    return "failed" if state in ("dead", "failed") else state


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """What opening a batch writes: its id, its callbacks' jobs by kind (each carrying the
    ``BATCH_INFO_SLOT`` header and the key ``callback_key(id, kind)``), ``fail_fast``, how long
    its record lives once complete (``keep_for``), the idempotency key ttl of its callbacks,
    and the batch it is a child of (None: none).

    A flow (``aqw.Flow``) is made of batches with more: ``members``, children's job ids
    known before they are enqueued (a flow's steps; counted in ``total`` at once);
    ``sealed``, opened sealed (a step's gate: its parents are all its members); ``inputs``,
    the gate's parents' step names, in ``members``' order: the callback's payload
    (``FLOW_INPUT_SLOT``) becomes the parent's result (one parent) or a mapping of name to
    result (several); when the gate completes without enqueueing its callback (a parent
    failed), the callback's job is ended cancelled, unrun, and counted so in the batches its
    ``BATCH_HEADER`` names (``data``: what the flow keeps about itself)."""

    id: str
    callbacks: dict[str, Job]
    fail_fast: bool = False
    keep_for: float = 86_400.0
    key_ttl: float = 86_400.0
    parent: str | None = None
    members: tuple[str, ...] = ()
    sealed: bool = False
    inputs: tuple[str, ...] = ()
    data: str = ""


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """A batch's state and counts: ``total`` children added, ``pending`` not final yet,
    ``succeeded``, ``failed`` (dead-lettered or failed), ``cancelled``, ``expired``; the
    callback jobs enqueued, kind -> job id (empty until the batch completes)."""

    id: str
    state: BatchState
    total: int = 0
    pending: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    expired: int = 0
    fail_fast: bool = False
    parent: str | None = None
    created_at: float | None = None
    completed_at: float | None = None
    callbacks: dict[str, str] = field(default_factory=dict)
    #: A flow's definition (``aqw.Flow``), as it keeps it; "" for a batch.
    data: str = ""

    @property
    def done(self) -> int:
        """Children that reached a final state."""
        return self.succeeded + self.failed + self.cancelled + self.expired

    @property
    def complete(self) -> bool:
        return self.state in ("complete", "cancelled")

    @property
    def outcome(self) -> str:
        """What a parent batch counts this batch as: succeeded when every child succeeded,
        failed when one failed, else cancelled (or expired)."""
        if self.failed:
            return "failed"
        if self.cancelled or self.state == "cancelled":
            return "cancelled"
        return "expired" if self.expired else "succeeded"

    @classmethod
    def from_fields(
        cls, batch_id: str, fields: dict[str, str], pending: int, callbacks: dict[str, str]
    ) -> BatchInfo:
        """Read leniently from a broker's strings (a number that does not parse is 0)."""

        def num(name: str) -> int:
            try:
                return int(fields.get(name) or 0)
            except ValueError:
                return 0

        def when(name: str) -> float | None:
            try:
                return float(fields[name]) if fields.get(name) else None
            except ValueError:
                return None

        state = fields.get("state", "open")
        return cls(
            id=batch_id,
            state=state if state in ("open", "sealed", "complete", "cancelled") else "open",  # type: ignore[arg-type]
            total=num("total"),
            pending=pending,
            succeeded=num("succeeded"),
            failed=num("failed"),
            cancelled=num("cancelled"),
            expired=num("expired"),
            fail_fast=fields.get("fail_fast") == "1",
            parent=fields.get("parent") or None,
            created_at=when("created_at"),
            completed_at=when("completed_at"),
            callbacks=callbacks,
            data=fields.get("data", ""),
        )

    def to_json(self) -> str:
        """The counts as the callback's ``BATCH_INFO_HEADER`` carries them."""
        return json.dumps(
            {
                "id": self.id,
                "state": self.state,
                "total": self.total,
                "pending": self.pending,
                "succeeded": self.succeeded,
                "failed": self.failed,
                "cancelled": self.cancelled,
                "expired": self.expired,
                "callbacks": self.callbacks,
                **{k: v for k, v in self._times().items() if v is not None},
            },
            separators=(",", ":"),
        )

    def _times(self) -> dict[str, float | None]:
        return {"created_at": self.created_at, "completed_at": self.completed_at}

    @classmethod
    def from_json(cls, text: str) -> BatchInfo:
        """The counts a callback's header carries."""
        data = json.loads(text)
        fields = {k: str(v) for k, v in data.items() if k not in ("callbacks", "pending")}
        callbacks = {str(k): str(v) for k, v in dict(data.get("callbacks") or {}).items()}
        return cls.from_fields(str(data["id"]), fields, int(data.get("pending") or 0), callbacks)
