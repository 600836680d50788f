"""Job records shared across processes, in the queue's ``AQW_q_RECORDS`` bucket: key
``job.<id>`` holds the record's fields and its end (``_until``, seconds since the epoch) as
JSON. Every step rewrites it with ``update(last=revision)`` (``create`` when absent), read
again and retried when another process wrote it between the read and the write, so a
cancel that lands while a job starts is never lost, and a running record is only moved on by
the holder whose fencing token it names. Waiting for a job's end is a watch of its key (no
polling); the bucket's ``max_age`` (``MAX_AGE``) drops what nobody read after its end.

The fields, and how each step changes them, are those of ``aqw.brokers.local.records``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Callable, Mapping

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from ...errors import JobCancelled, StaleStart, UnknownJob
from ...job import Job
from ...record import (
    DEFAULT_KEEP_FOR,
    FINAL_STATES,
    UNFINISHED_KEEP,
    JobInfo,
    queued_fields,
)
from ..local.records import RUNNING_FIELDS, running_state
from ..messages import CancelOutcome
from ._leases import kv_key
from ._state import entries

#: Seconds the bucket keeps a record after its last write, whatever its ``_until`` says.
MAX_AGE = UNFINISHED_KEEP + 86_400.0

#: Seconds a waiter's watch may be quiet before the record is read as well.
WATCH_QUIET = 2.0

#: Most records whose last revision this process remembers.
MAX_KNOWN = 10_000

Fields = dict[str, str]
#: A step: the record's fields now (None: no record) -> (new fields, seconds to keep), or
#: None to write nothing.
Step = Callable[[Fields | None], tuple[Fields, float] | None]


def _key(job_id: str) -> str:
    return kv_key(f"job.{job_id}")


def _decode(raw: bytes | None) -> tuple[Fields, float, str] | None:
    """(fields, until, job id) of a stored record; None when it does not read."""
    try:
        value = json.loads(raw or b"")
        until = float(value.pop("_until"))
        job_id = str(value.pop("_id"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return {str(k): str(v) for k, v in value.items()}, until, job_id


class KvJobRecords:
    """A ``JobRecords`` part on a KV bucket (module docstring)."""

    #: Every process that opens the queue sees them.
    shared = True

    def __init__(self, queue: str, opener: Callable[[], Awaitable[KeyValue]]) -> None:
        self.queue = queue
        self._open = opener
        #: job id -> (fields, revision) of the records this process read or wrote last and
        #: whose job has not ended here: the next step writes with that revision at once
        #: (read again only when another process wrote it since).
        self._known: dict[str, tuple[Fields, int]] = {}

    # -- reading and writing ----------------------------------------------------------------

    async def _read(self, job_id: str) -> tuple[Fields | None, int | None]:
        """(fields, revision): fields None when there is no live record."""
        try:
            entry = await (await self._open()).get(_key(job_id))
        except KeyNotFoundError:
            return None, None
        got = _decode(entry.value)
        if got is None or got[1] <= time.time():
            return None, entry.revision
        if entry.revision is not None and len(self._known) < MAX_KNOWN:
            self._known[job_id] = (got[0], entry.revision)
        return got[0], entry.revision

    def known(self, job_id: str) -> Fields | None:
        """The record as this process last read or wrote it (no round trip), if it did."""
        got = self._known.get(job_id)
        return None if got is None else got[0]

    async def fields(self, job_id: str) -> Fields | None:
        return (await self._read(job_id))[0]

    async def _change(self, job_id: str, step: Step, fresh: bool = False) -> Fields | None:
        """Apply ``step`` to the record by compare-and-set; the fields written, or None.
        ``fresh``: the job is new, most likely without a record: create it at once."""
        kv = await self._open()
        known = self._known.pop(job_id, None)
        if fresh and known is None:
            out = step(None)
            if out is not None:
                try:
                    written = await kv.create(_key(job_id), self._value(job_id, *out))
                except KeyWrongLastSequenceError:
                    pass  # it has one (the same job published again): the read below
                else:
                    self._known[job_id] = (out[0], written)
                    return out[0]
        for _ in range(20):
            cached = known is not None
            fields: Fields | None
            revision: int | None
            if known is not None:
                fields, revision = known
                known = None
            else:
                fields, revision = await self._read(job_id)
                self._known.pop(job_id, None)
            out = step(None if fields is None else dict(fields))
            if out is None:
                if cached:
                    continue  # decided on what this process knew: read it first
                return None
            new, keep = out
            value = self._value(job_id, new, keep)
            try:
                if revision is None:
                    written = await kv.create(_key(job_id), value)
                else:
                    written = await kv.update(_key(job_id), value, last=revision)
            except KeyWrongLastSequenceError:
                continue  # another process wrote it since the read: again
            if new.get("state") not in FINAL_STATES and len(self._known) < MAX_KNOWN:
                self._known[job_id] = (new, written)
            return new
        raise ConnectionError(f"the record of job {job_id!r} kept changing under its write")

    @staticmethod
    def _value(job_id: str, fields: Fields, keep: float) -> bytes:
        until = time.time() + max(0.0, keep)
        return json.dumps({**fields, "_until": until, "_id": job_id}).encode()

    # -- the job's steps ------------------------------------------------------------------

    async def enqueued(self, job: Job, run_at: float | None = None) -> int | None:
        """Write the record of a job just enqueued; its revision when it now holds exactly
        ``queued_fields(job)`` (a job due now), for the job's message to carry: its worker's
        start then writes the record at once, without reading it first (``started``)."""
        now = time.time()
        due = run_at if run_at is not None and run_at > now else None
        fields = queued_fields(job, due)
        keep = UNFINISHED_KEEP + (due - now if due else 0.0)
        await self._change(job.id, lambda _: (fields, keep), fresh=job.attempt == 1)
        got = self._known.get(job.id)
        return got[1] if due is None and got is not None and got[0] is fields else None

    async def started(
        self,
        job: Job,
        worker: str,
        fence: int,
        lease_expires_at: float,
        enqueued_revision: int | None = None,
    ) -> None:
        """Mark the job running under ``fence``; ``JobCancelled`` or ``StaleStart`` (ended)
        when the record says so at the write, changing nothing. ``enqueued_revision``: the
        revision its producer wrote (``enqueued``, carried by the job's message): the write
        goes at once against it, and only a record changed since (a cancel, another
        start) is read first."""
        if enqueued_revision is not None and job.id not in self._known:
            self._known[job.id] = (queued_fields(job, None), enqueued_revision)

        def step(fields: Fields | None) -> tuple[Fields, float]:
            if fields is not None and (
                fields.get("state") == "cancelled" or fields.get("cancel") == "1"
            ):
                raise JobCancelled(job.id)
            if fields is not None and fields.get("state") in FINAL_STATES:
                raise StaleStart(job.id, ended=True)
            out = fields or {"task": job.task, "enqueued_at": repr(job.enqueued_at)}
            out.update(
                state="running",
                attempts=str(job.attempt),
                started_at=repr(time.time()),
                worker=worker,
                fencing_token=str(fence),
                lease_expires_at=repr(lease_expires_at),
                progress="",
                message="",
                run_at="",
            )
            return out, UNFINISHED_KEEP

        await self._change(job.id, step)

    async def update(self, job_id: str, fields: Mapping[str, str], fence: int) -> None:
        """Move a running record's progress, message and lease expiry on, while it runs
        under ``fence``."""

        def step(current: Fields | None) -> tuple[Fields, float] | None:
            if current is None or current.get("state") != "running":
                return None
            if current.get("fencing_token") != str(fence):
                return None
            current.update((k, fields[k]) for k in RUNNING_FIELDS if k in fields)
            return current, UNFINISHED_KEEP

        await self._change(job_id, step)

    async def retrying(self, job: Job, run_at: float, failure: Mapping[str, str]) -> None:
        def step(fields: Fields | None) -> tuple[Fields, float]:
            out = fields or {"task": job.task, "enqueued_at": repr(job.enqueued_at)}
            out.update(failure)
            out.update(state="retrying", run_at=repr(run_at), attempts=str(job.attempt - 1))
            return out, UNFINISHED_KEEP + max(0.0, run_at - time.time())

        await self._change(job.id, step)

    async def deferred(self, job: Job, run_at: float) -> None:
        def step(fields: Fields | None) -> tuple[Fields, float]:
            out = fields or {"task": job.task, "enqueued_at": repr(job.enqueued_at)}
            out.update(state="delayed", run_at=repr(run_at), attempts=str(job.attempt - 1))
            return out, UNFINISHED_KEEP + max(0.0, run_at - time.time())

        await self._change(job.id, step)

    async def given_back(self, job_id: str) -> None:
        def step(fields: Fields | None) -> tuple[Fields, float] | None:
            if fields is None or fields.get("state") != "running":
                return None
            return {**fields, "state": "queued"}, UNFINISHED_KEEP

        await self._change(job_id, step)

    async def replayed(self, job: Job) -> None:
        cleared = dict.fromkeys(("run_at", "finished_at", "dlq_entry", "cancel"), "")

        def step(fields: Fields | None) -> tuple[Fields, float] | None:
            if fields is None:
                return None
            return {**fields, **cleared, "state": "queued"}, UNFINISHED_KEEP

        if await self._change(job.id, step) is None:
            await self.enqueued(job)

    async def finish(
        self, job: Job, state: str, fields: Mapping[str, str], keep_for: float
    ) -> None:
        def step(current: Fields | None) -> tuple[Fields, float]:
            out = current or {"task": job.task}
            out.setdefault("enqueued_at", repr(job.enqueued_at))
            out.update(fields)
            out["state"] = state
            return out, keep_for

        await self._change(job.id, step)

    # -- the part -------------------------------------------------------------------------

    async def record(self, job_id: str) -> JobInfo | None:
        fields = await self.fields(job_id)
        return None if fields is None else JobInfo.from_fields(job_id, self.queue, fields)

    async def cancel(self, job_id: str, keep_for: float = DEFAULT_KEEP_FOR) -> CancelOutcome:
        outcome: list[CancelOutcome] = ["unknown"]

        def step(fields: Fields | None) -> tuple[Fields, float] | None:
            if fields is None:
                outcome[0] = "unknown"
                return None
            state = fields.get("state", "")
            if state in FINAL_STATES:
                outcome[0] = "finished"
                return None
            if state == "running":
                outcome[0] = "cancelling"
                return {**fields, "cancel": "1"}, UNFINISHED_KEEP
            outcome[0] = "cancelled"
            done = {**fields, "state": "cancelled", "cancel": "1", "finished_at": repr(time.time())}
            # Its message may still wait in the queue: the record outlives it.
            return done, max(keep_for, UNFINISHED_KEEP)

        await self._change(job_id, step)
        return outcome[0]

    async def cancel_requested(self, job_id: str) -> bool:
        fields = await self.fields(job_id)
        return fields is not None and fields.get("cancel") == "1"

    async def wait_finished(self, job_id: str, timeout: float | None) -> JobInfo:
        kv = await self._open()
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        watcher = await kv.watch(_key(job_id))
        seen = False
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"job {job_id!r} has not ended within {timeout}s")
                try:
                    entry = await watcher.updates(timeout=min(left, WATCH_QUIET))  # type: ignore[no-untyped-call]
                except TimeoutError:
                    # A watch can lose its first values (``_state.entries``): the record
                    # is read as well whenever the watch has been quiet a while.
                    now = await self.record(job_id)
                    if now is None:
                        raise UnknownJob(job_id, self.queue) from None
                    if now.finished:
                        return now
                    continue
                if entry is None:  # the end of the values there were
                    if not seen:
                        raise UnknownJob(job_id, self.queue)
                    continue
                if entry.operation in ("DEL", "PURGE"):
                    raise UnknownJob(job_id, self.queue)
                got = _decode(entry.value)
                if got is None or got[1] <= time.time():
                    raise UnknownJob(job_id, self.queue)
                seen = True
                info = JobInfo.from_fields(job_id, self.queue, got[0])
                if info.finished:
                    return info
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]

    async def set_running_state(self, job_id: str, state: dict[str, str]) -> None:
        try:
            fence = int(state.get("fencing_token", ""))
        except ValueError:
            return
        await self.update(job_id, state, fence)

    async def running_state(self, job_id: str) -> dict[str, str] | None:
        fields = await self.fields(job_id)
        return None if fields is None else running_state(job_id, fields, time.time())

    async def running_states(self, limit: int = 1000) -> list[dict[str, str]]:
        """Every record read (a watch of the bucket): for ``aqw status`` and the monitor,
        not for a hot path."""
        now = time.time()
        out: list[dict[str, str]] = []
        for _, raw in await entries(await self._open(), "job"):
            got = _decode(raw)
            if got is None or got[1] <= now:
                continue
            state = running_state(got[2], got[0], now)
            if state is not None:
                out.append(state)
        out.sort(key=lambda s: s.get("started_at", ""))
        return out[:limit]
