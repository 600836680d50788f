"""Idempotency keys and completion records in the queue's ``AQW_q_KEYS`` bucket.

Key ``key.<key>`` is the claim of the enqueue that took the key, as JSON: the job's id, the
claim's end (``until``), when it was made (``at``) and, while it is *pending*, the job's
wire form and due time. It is written with ``create`` (or ``update(last=revision)`` over an
expired one), so of two producers racing for a key exactly one enqueues. The winner then
publishes the job under ``Nats-Msg-Id`` = the job's id (the stream drops a second publish
of it within its duplicate window) and *confirms* the claim (the pending part removed, by
compare-and-set). A producer killed between the claim and the publish leaves a pending
claim: the next enqueue of the key finds it and publishes the claimed job itself, from the
claim, under the same id (dropped by the server when the first publish did go out), then
confirms it (``Stuck``). ``done.<key>`` is the completion record an ack writes."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from ._leases import kv_key


@dataclass(frozen=True, slots=True)
class Pending:
    """A pending claim, to be confirmed once its job is published."""

    revision: int
    confirmed: bytes  # the claim's value without its pending part


@dataclass(frozen=True, slots=True)
class Stuck(Pending):
    """A pending claim of another enqueue: its job may never have been published."""

    job_id: str
    data: bytes  # the job's wire form
    run_at: float | None
    age: float  # seconds since the claim was made


@dataclass(frozen=True, slots=True)
class _Claim:
    job_id: str
    until: float
    at: float
    data: bytes | None  # set while pending
    run_at: float | None


def _encode(claim: _Claim) -> bytes:
    value: dict[str, object] = {"id": claim.job_id, "until": claim.until, "at": claim.at}
    if claim.data is not None:
        value["job"] = claim.data.decode("utf-8", "surrogateescape")
        value["run_at"] = claim.run_at
    return json.dumps(value).encode("utf-8", "surrogateescape")


def _decode(value: bytes | None) -> _Claim:
    raw = value or b""
    try:
        got = json.loads(raw)
        data = got.get("job")
        run_at = got.get("run_at")
        return _Claim(
            str(got["id"]),
            float(got["until"]),
            float(got.get("at", 0.0)),
            None if data is None else str(data).encode("utf-8", "surrogateescape"),
            None if run_at is None else float(run_at),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    job_id, _, until = raw.decode("utf-8", "replace").partition(" ")  # "<id> <until>"
    try:
        return _Claim(job_id, float(until), 0.0, None, None)
    except ValueError:
        return _Claim(job_id, 0.0, 0.0, None, None)


class Keys:
    """The claims of idempotency keys and the completion records."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    async def _live(self, name: str) -> tuple[_Claim | None, int | None]:
        """(claim, revision) of a live record; (None, revision) of an expired one;
        (None, None) when there is none."""
        try:
            entry = await self._kv.get(kv_key(name))
        except KeyNotFoundError:
            return None, None
        claim = _decode(entry.value)
        return (claim if claim.until > time.time() else None), entry.revision

    async def claim(
        self, key: str, job_id: str, data: bytes, run_at: float | None, ttl: float
    ) -> tuple[str, Pending | None]:
        """Claim ``key`` for the job ``job_id`` (wire form ``data``), pending until
        ``confirm``. Returns (``job_id``, the ``Pending`` claim) when claimed; else (the id
        of the job holding the key, a ``Stuck`` when its claim is still pending, or None: a
        confirmed claim or a completion record)."""
        done, _ = await self._live(f"done.{key}")
        if done is not None:
            return done.job_id, None
        name = kv_key(f"key.{key}")
        for _ in range(3):
            holder, revision = await self._live(f"key.{key}")
            if holder is not None:
                return holder.job_id, _stuck(holder, revision)
            now = time.time()
            value = _encode(_Claim(job_id, now + ttl, now, data, run_at))
            confirmed = _encode(_Claim(job_id, now + ttl, now, None, None))
            try:
                if revision is None:
                    written = await self._kv.create(name, value)
                else:
                    written = await self._kv.update(name, value, last=revision)
                return job_id, Pending(written, confirmed)
            except KeyWrongLastSequenceError:
                continue  # another producer wrote it first: read who
        holder, revision = await self._live(f"key.{key}")
        if holder is None:
            raise ConnectionError(f"the idempotency key {key!r} kept changing under its claim")
        return holder.job_id, _stuck(holder, revision)

    async def confirm(self, key: str, pending: Pending) -> None:
        """The pending claim's job is published: drop its pending part, by compare-and-set
        (nothing when another producer confirmed or replaced it since)."""
        with contextlib.suppress(KeyWrongLastSequenceError):  # confirmed by another meanwhile
            await self._kv.update(kv_key(f"key.{key}"), pending.confirmed, last=pending.revision)

    async def complete(self, key: str, job_id: str, ttl: float) -> None:
        done = _Claim(job_id, time.time() + ttl, time.time(), None, None)
        await self._kv.put(kv_key(f"done.{key}"), _encode(done))

    async def completed(self, key: str) -> bool:
        done, _ = await self._live(f"done.{key}")
        return done is not None


def _stuck(claim: _Claim, revision: int | None) -> Stuck | None:
    if claim.data is None or revision is None:
        return None
    confirmed = _encode(_Claim(claim.job_id, claim.until, claim.at, None, None))
    age = time.time() - claim.at
    return Stuck(revision, confirmed, claim.job_id, claim.data, claim.run_at, age)
