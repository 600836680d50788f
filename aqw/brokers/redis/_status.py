"""Running-job states, worker heartbeats and lifetime counters of a queue on Redis, read in
bounded amounts and validated: what ``aqw status``, the monitor and ``app.job_status`` see.
A running job's state is its record (``aqw:{q}:job:<id>``, ``aqw/record.py``) while it reads
running, found through the ``aqw:{q}:running`` index."""

from __future__ import annotations

import json
import time
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from ..._damage import (
    check_job_state,
    damaged_heartbeat,
    heartbeat_damage,
    parse_json,
    shown,
    to_int,
)
from ..._redis import scripts
from ..._redis.batch import CommandBatcher
from ..._redis.keys import QueueKeys
from ...record import STATES, UNFINISHED_KEEP
from ..local.records import RUNNING_FIELDS
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
    ``damaged`` note (``aqw._damage``): such a record is shown, not hidden."""
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


class RedisStatus:
    """The status records of one queue (``RedisBroker.status``)."""

    def __init__(self, client: Redis, batcher: CommandBatcher, keys: QueueKeys) -> None:
        self._client = client
        self._batcher = batcher
        self._keys = keys
        self._progress = scripts.load("job_progress")

    async def set_job_state(self, job_id: str, state: dict[str, str], ttl: float) -> None:
        """Update the progress, message and lease expiry of a job's record while it reads
        running under ``state["fencing_token"]`` (``job_progress.lua``): an ended or missing
        record is never written, nor is anything without a fencing token. ``ttl`` is not
        used: the record keeps its own (refreshed when less than half is left)."""
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

    async def clear_job_state(self, job_id: str) -> None:
        """Nothing to do: the script that ends a job updates its record and the index."""

    async def job_state(self, job_id: str) -> dict[str, str] | None:
        """The running state of a job (``running_state``), or None when it is not running."""
        try:
            raw: Any = await self._batcher.execute("HGETALL", self._keys.record(job_id))
        except ResponseError as exc:  # WRONGTYPE: someone wrote another type at the key
            return {"job_id": job_id, "damaged": f"the state key is not a hash ({exc})"}
        return running_state(job_id, raw) if raw else None

    async def job_states(self, limit: int = 1000) -> list[dict[str, str]]:
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

    async def publish_heartbeat(self, worker: str, data: dict[str, Any], ttl: float) -> None:
        pipe = self._client.pipeline(transaction=False)
        pipe.set(self._keys.worker(worker), json.dumps(data), px=max(1, int(ttl * 1000)))
        pipe.sadd(self._keys.workers, worker)
        await pipe.execute()

    async def heartbeats(self) -> list[dict[str, Any]]:
        """Up to 1000 heartbeats. One that is not JSON, or not of the shape a
        worker or monitor publishes, comes back as ``aqw._damage.damaged_heartbeat``."""
        limit = 1000  # workers read at most: SSCAN, not SMEMBERS, so a forged set is cheap
        names: set[str] = set()
        cursor: Any = 0
        try:
            # Names are cheap next to beats: scan several times the cap, so that which beats
            # are read (the first ``limit`` names in order) does not hang on the set's
            # iteration order, which a server's hash seed decides.
            while True:
                cursor, batch = await self._client.sscan(self._keys.workers, cursor, count=limit)
                names.update(text(n) for n in batch)
                if not int(cursor) or len(names) >= 10 * limit:
                    break
        except ResponseError as exc:  # WRONGTYPE: the workers key is not a set
            return [damaged_heartbeat(self._keys.workers, f"not a set ({exc})")]
        if not names:
            return []
        ordered = sorted(names)[:limit]
        values: Any = await self._client.mget([self._keys.worker(n) for n in ordered])
        gone = [n for n, v in zip(ordered, values, strict=True) if v is None]
        if gone:
            await self._client.srem(self._keys.workers, *gone)
        out: list[dict[str, Any]] = []
        for name, value in zip(ordered, values, strict=True):
            if value is None:
                continue
            beat, problem = parse_json(value)
            problem = problem or heartbeat_damage(beat)
            out.append(beat if problem is None else damaged_heartbeat(name, problem))
        return out

    async def remove_heartbeat(self, worker: str) -> None:
        pipe = self._client.pipeline(transaction=False)
        pipe.delete(self._keys.worker(worker))
        pipe.srem(self._keys.workers, worker)
        await pipe.execute()

    async def stats(self) -> dict[str, int]:
        """The counters of the stats hash (at most 1000 fields); a field that is not an
        integer is left out (``aqw status`` names it)."""
        out: dict[str, int] = {}
        cursor: Any = 0
        try:
            while True:
                reply: Any = await self._client.hscan(self._keys.stats, cursor, count=1000)
                cursor, batch = reply
                for k, v in batch.items():
                    n = to_int(v, None)
                    if n is not None:
                        out[text(k)] = n
                if not int(cursor) or len(out) >= 1000:
                    return out
        except ResponseError:  # WRONGTYPE: not a hash; `aqw status` reports it
            return out
