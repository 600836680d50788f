"""Debounced enqueue on NATS (``KvDebounce``, a shared ``Debounce`` part): the waiting job of
a key is kept in the queue's ``AQW_q_KEYS`` bucket, changed only by compare-and-set on the
key's revision; a *timer* message in the delayed stream brings it to the queue.

Key ``debounce.<key>`` holds, as JSON, the waiting job's id, the burst's first enqueue, the
job's due time, its wire form (the last payload) and its state: ``waiting``, or ``moved``
once the promoter took it to the queue.

- An enqueue that finds the key's job ``waiting`` (and its record not ended, e.g. by a
  cancel) rewrites it: the new payload under the waiting job's id, the due time pushed back
  to ``aqw.flow.due_time(...)``. One write, nothing else sent: the timer already waits.
- Otherwise it starts a burst: it publishes a timer (the job, ``Aqw-Debounce: 1``, under
  ``Nats-Msg-Id`` ``debounce.<id>``) due at ``now + debounce``, then writes the key. A
  producer killed between the two leaves a timer whose job the key does not name: dropped
  when it fires. A write that loses a race goes round again (the other's job replaced).
- The promoter, handed a timer: the key no longer naming its job: dropped. ``waiting`` and
  not due yet (pushed back): nak'd with the time left. Due: the key is marked ``moved`` by
  compare-and-set (a replace that lands first makes it read again), then the job (from the
  key) published to the queue under ``Nats-Msg-Id`` ``debounce.<id>``, then the timer acked.
  A promoter killed after the mark gets the timer again (its AckWait) and publishes again
  (dropped as a duplicate when it went out). The enqueue that starts the next burst over a
  key moved less than the duplicate window ago publishes the moved job the same way first,
  so a timer lost after the mark cannot lose the job either.

What a debounced job costs, beside the records: a replace is a read of the key, of the
job's record and a write of each; a burst's start a timer publish more."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from ...errors import MalformedJob
from ...flow import DEBOUNCE_SLACK, due_time
from ...job import Job
from ...record import FINAL_STATES
from ..local.priorities import level_of
from ._delayed import DUE, TIMER
from ._layout import DUPLICATE_WINDOW, Layout
from ._leases import kv_key
from ._records import KvJobRecords

#: Seconds after its move within which a moved job is published again by the next burst's
#: first enqueue (inside the duplicate window, with a margin: the server drops it then).
REPEAT_MOVE = DUPLICATE_WINDOW - 10.0

#: Most compare-and-set rounds of one enqueue or promotion.
ROUNDS = 100


async def _back_off(round_: int) -> None:
    """A short random wait after a lost compare-and-set: producers racing on one key take
    turns instead of all reading again at once."""
    await asyncio.sleep(random.uniform(0, 0.002 * min(round_ + 1, 10)))


Parts = Callable[[], Awaitable[tuple[JetStreamContext, KeyValue]]]


@dataclass(frozen=True, slots=True)
class _Waiting:
    job_id: str
    first: float
    due: float
    until: float  # the key is forgotten after this (its job moved or its timer lost)
    data: bytes
    moved_at: float | None = None


def _encode(w: _Waiting) -> bytes:
    value = {
        "id": w.job_id,
        "first": w.first,
        "due": w.due,
        "until": w.until,
        "job": w.data.decode("utf-8", "surrogateescape"),
        "moved_at": w.moved_at,
    }
    return json.dumps(value).encode("utf-8", "surrogateescape")


def _decode(raw: bytes | None) -> _Waiting | None:
    try:
        v = json.loads(raw or b"")
        moved = v.get("moved_at")
        return _Waiting(
            str(v["id"]),
            float(v["first"]),
            float(v["due"]),
            float(v["until"]),
            str(v["job"]).encode("utf-8", "surrogateescape"),
            None if moved is None else float(moved),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


class KvDebounce:
    """Debounced enqueue on one queue (``NatsBroker.debounce``), shared by every process."""

    shared = True

    def __init__(self, names: Layout, parts: Parts, records: KvJobRecords) -> None:
        self._names = names
        self._parts = parts
        self._records = records

    async def _read(self, kv: KeyValue, name: str) -> tuple[_Waiting | None, int | None]:
        try:
            entry = await kv.get(name)
        except KeyNotFoundError:
            return None, None
        return _decode(entry.value), entry.revision

    async def _still_waiting(self, held: _Waiting | None, now: float) -> bool:
        if held is None or held.moved_at is not None or held.until <= now:
            return False
        fields = await self._records.fields(held.job_id)
        return fields is None or fields.get("state") not in FINAL_STATES

    async def publish(
        self, job: Job, debounce: float, debounce_max: float | None
    ) -> tuple[str, bool]:
        assert job.key is not None
        js, kv = await self._parts()
        name = kv_key(f"debounce.{job.key}")
        timer_sent = False
        for round_ in range(ROUNDS):
            now = time.time()
            held, revision = await self._read(kv, name)
            if held is not None and revision is not None and await self._still_waiting(held, now):
                due = due_time(now, held.first, debounce, debounce_max)
                new_job = job.model_copy(update={"id": held.job_id})
                until = max(due, now) + DEBOUNCE_SLACK
                new = replace(held, due=due, until=until, data=new_job.encode())
                try:
                    await kv.update(name, _encode(new), last=revision)
                except KeyWrongLastSequenceError:
                    await _back_off(round_)  # moved, or replaced by another producer
                    continue
                await self._records.enqueued(new_job, due)
                return held.job_id, True
            moved_at = None if held is None else held.moved_at
            if held is not None and moved_at is not None and now - moved_at < REPEAT_MOVE:
                await self._move(js, held)  # its move went out (dropped as a duplicate)
            due = due_time(now, now, debounce, debounce_max)
            data = job.encode()
            if not timer_sent:
                headers = {DUE: repr(due), TIMER: "1", "Nats-Msg-Id": f"debounce.{job.id}"}
                names = self._names
                await js.publish(
                    names.delayed_subject, data, stream=names.delayed_stream, headers=headers
                )
                timer_sent = True
            new = _Waiting(job.id, now, due, max(due, now) + DEBOUNCE_SLACK, data)
            try:
                if revision is None:
                    await kv.create(name, _encode(new))
                else:
                    await kv.update(name, _encode(new), last=revision)
            except KeyWrongLastSequenceError:
                await _back_off(round_)  # another producer wrote the key first: join it
                continue
            await self._records.enqueued(job, due)
            return job.id, False
        raise ConnectionError(f"the debounce key {job.key!r} kept changing under its write")

    async def _move(self, js: JetStreamContext, held: _Waiting) -> None:
        names = self._names
        subject = names.subject_for(level_of(held.data))
        headers = {"Nats-Msg-Id": f"debounce.{held.job_id}"}
        await js.publish(subject, held.data, stream=names.stream, headers=headers)

    async def promote(self, timer: bytes) -> float | None:
        """A timer's turn: None when it is done with (moved, or stale: ack it), else the
        due time it waits for now (nak it until then)."""
        try:
            job = Job.decode(timer)
        except MalformedJob:
            return None
        if job.key is None:
            return None
        js, kv = await self._parts()
        name = kv_key(f"debounce.{job.key}")
        for _ in range(ROUNDS):
            held, revision = await self._read(kv, name)
            if held is None or revision is None or held.job_id != job.id:
                return None  # the key names another job: this timer's was never written
            if held.moved_at is None:
                now = time.time()
                if held.due > now:
                    return held.due
                moved = replace(held, moved_at=now, until=now + DEBOUNCE_SLACK)
                try:
                    await kv.update(name, _encode(moved), last=revision)
                except KeyWrongLastSequenceError:
                    continue  # replaced meanwhile: pushed back, most likely
            await self._move(js, held)
            return None
        raise ConnectionError(f"the debounce key {job.key!r} kept changing under its move")
