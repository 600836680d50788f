"""The job records of a queue on Redis (``RedisJobRecords``, a shared ``JobRecords`` part):
each job's record ``aqw:{q}:job:<id>`` (``aqw/record.py``), written by the scripts that move
the job (``_jobs.py``, ``_job_start.py``); read back, waited for (``aqw/_redis/waiters.py``),
cancelled (``cancel.lua``), and, while it reads running, found through the
``aqw:{q}:running`` index as a running job's state, read in bounded amounts and validated."""

from __future__ import annotations

import time
from typing import Any, cast

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from ..._readback import check_job_state, shown, to_int
from ..._redis import scripts
from ..._redis.batch import CommandBatcher
from ..._redis.keys import QueueKeys
from ..._redis.scripts import ms
from ..._redis.waiters import JobWaiters
from ...record import DEFAULT_KEEP_FOR, STATES, UNFINISHED_KEEP, JobInfo
from ..local.records import RUNNING_FIELDS
from ..messages import CancelOutcome
from ._cancels import cancel_channel
from ._entries import text

#: Most ids of the running index one ``job_states`` call looks at.
SCAN_LIMIT = 10_000


def running_state(job_id: str, raw: dict[Any, Any]) -> dict[str, str] | None:
    """A running job's record in the shape of a worker's published running state (what
    ``aqw status``, the monitor and the watchdog read: state, job_id, task, attempt, worker,
    started_at, lease_expires_at, fencing_token, progress, message), or None when the record
    is of a job that is not running. A job whose worker died stays running, its lease expiry
    in the past, until another worker takes it over (the monitor reports it as orphaned). A
    number that does not parse, or a state that is not one (a hash aqw did not write), gets a
    ``damaged`` note (``aqw._readback``): such a record is shown, not hidden."""
    f = {text(k): text(v) for k, v in raw.items()}
    state = f.get("state", "")
    if state != "running" and state in STATES:
        return None
    out = check_job_state(
        {
            "state": "running",
            "job_id": job_id,
            "task": f.get("task", ""),
            # "attempt": the field of the running states of aqw 0.1, at the same key
            "attempt": f.get("attempts", f.get("attempt", "")),
            "worker": f.get("worker", ""),
            "started_at": f.get("started_at", ""),
            "lease_expires_at": f.get("lease_expires_at", ""),
            "fencing_token": f.get("fencing_token", ""),
            "progress": f.get("progress") or "0.0",
            "message": f.get("message", ""),
        }
    )
    if state != "running":
        note = f"state {shown(state)} is not a job state"
        out["damaged"] = f"{out['damaged']}; {note}" if "damaged" in out else note
    return out


def _moved_on(raw: dict[Any, Any]) -> bool:
    """True when a record read from the running index is of a job that no longer runs."""
    state = text(raw.get(b"state", raw.get("state", "")))
    return state in STATES and state != "running"


class RedisJobRecords:
    """The job records of one queue (``RedisBroker.records``), shared by every process."""

    shared = True

    def __init__(
        self, client: Redis, batcher: CommandBatcher, keys: QueueKeys, waiters: JobWaiters
    ) -> None:
        self._client = client
        self._batcher = batcher
        self._keys = keys
        self.waiters = waiters
        self._progress = scripts.load("job_progress")
        self._cancel = scripts.load("cancel")

    async def record(self, job_id: str) -> JobInfo | None:
        """The job's record; None also when its key holds another type than a hash (not a
        record aqw wrote: ``cancel`` says "unknown" and ``wait_finished`` raises
        ``UnknownJob`` for it too)."""
        return await self.waiters.read(job_id)

    async def wait_finished(self, job_id: str, timeout: float | None) -> JobInfo:
        return await self.waiters.wait(job_id, timeout)

    async def cancel(self, job_id: str, keep_for: float = DEFAULT_KEEP_FOR) -> CancelOutcome:
        k = self._keys
        outcome = await self._batcher.script(
            self._cancel,
            [k.record(job_id), k.waiters(job_id), k.stats],
            [job_id, ms(keep_for), repr(time.time())],
        )
        text = outcome.decode() if isinstance(outcome, bytes) else str(outcome)
        if text == "cancelling" and isinstance(self._client, Redis):  # ``_cancels.py``
            await self._batcher.execute("PUBLISH", cancel_channel(k), job_id)
        return cast(CancelOutcome, text)

    async def cancel_requested(self, job_id: str) -> bool:
        try:
            # asked with each renewal of the job's lease: by the priority lane, as the renewal
            flag = await self._batcher.priority.execute("HGET", self._keys.record(job_id), "cancel")
        except ResponseError:  # WRONGTYPE: not a record aqw wrote
            return False
        return flag in (b"1", "1")

    async def set_running_state(self, job_id: str, state: dict[str, str]) -> None:
        """Update the progress, message and lease expiry of a job's record while it reads
        running under ``state["fencing_token"]`` (``job_progress.lua``): an ended or missing
        record is never written, nor is anything without a fencing token. The record keeps its
        own time to live (refreshed when less than half is left)."""
        fence = to_int(state.get("fencing_token"), None)
        if fence is None:
            return
        pairs = [x for name in RUNNING_FIELDS if name in state for x in (name, state[name])]
        started = state.get("started_at") or repr(time.time())
        await self._batcher.script(
            self._progress,
            [self._keys.record(job_id), self._keys.running],
            [str(fence), int(UNFINISHED_KEEP * 1000), job_id, started, *pairs],
        )

    async def running_state(self, job_id: str) -> dict[str, str] | None:
        """The running state of a job (``running_state``), or None when it is not running."""
        try:
            raw: Any = await self._batcher.execute("HGETALL", self._keys.record(job_id))
        except ResponseError as exc:  # WRONGTYPE: someone wrote another type at the key
            return {"job_id": job_id, "damaged": f"the state key is not a hash ({exc})"}
        return running_state(job_id, raw) if raw else None

    async def running_states(self, limit: int = 1000) -> list[dict[str, str]]:
        """The running states of up to ``limit`` jobs of the running index, oldest start
        first (at most ``SCAN_LIMIT`` ids are looked at). Ids whose record is gone or has
        moved on are dropped from the index (and more are read in their place)."""
        limit = max(1, min(limit, 10_000))
        out: list[dict[str, str]] = []
        start = 0
        while len(out) < limit and start < SCAN_LIMIT:
            page = max(limit - len(out), 100)
            ids: Any = await self._client.zrange(self._keys.running, start, start + page - 1)
            if not ids:
                break
            kept = await self._states(ids, out, limit)
            start += kept
            if len(ids) < page:
                break
        return out

    async def _states(self, ids: list[Any], out: list[dict[str, str]], limit: int) -> int:
        """Append the running states of ``ids`` to ``out`` (up to ``limit``); drop from the
        index those whose record is gone or not running. Returns how many stay indexed."""
        pipe = self._client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(self._keys.record(text(job_id)))
        records: Any = await pipe.execute(raise_on_error=False)
        gone = []
        for job_id, raw in zip(ids, records, strict=True):
            if isinstance(raw, Exception):  # WRONGTYPE: not a hash
                state: dict[str, str] | None = {
                    "job_id": text(job_id),
                    "damaged": f"the state key is not a hash ({raw})",
                }
            elif not raw or _moved_on(raw):
                gone.append(job_id)  # ended (or expired) since
                continue
            else:
                state = running_state(text(job_id), raw)
            if state is not None and len(out) < limit:
                out.append(state)
        if gone:
            await self._client.zrem(self._keys.running, *gone)
        return len(ids) - len(gone)
