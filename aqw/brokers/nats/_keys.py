"""Idempotency keys and completion records in the queue's ``AQW_q_KEYS`` bucket: key
``key.<key>`` holds ``<job id> <expires_at>`` from the enqueue that claimed it, written with
``create`` (or ``update(last=revision)`` over an expired one), so of two producers racing for
a key exactly one enqueues; ``done.<key>`` is the completion record an ack writes.

The claim comes before the publish: a producer killed between the two holds the key for its
TTL without a job behind it (``aqw job`` on the id it names says unknown)."""

from __future__ import annotations

import time

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from ._leases import kv_key


def _value(job_id: str, ttl: float) -> bytes:
    return f"{job_id} {time.time() + ttl!r}".encode()


def _read(value: bytes | None) -> tuple[str, float]:
    job_id, _, until = (value or b"").decode("utf-8", "replace").partition(" ")
    try:
        return job_id, float(until)
    except ValueError:
        return job_id, 0.0


class Keys:
    """The claims of idempotency keys and the completion records."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    async def _live(self, name: str) -> tuple[str | None, int | None]:
        """(job id, revision) of a live record; (None, revision) of an expired one;
        (None, None) when there is none."""
        try:
            entry = await self._kv.get(kv_key(name))
        except KeyNotFoundError:
            return None, None
        job_id, until = _read(entry.value)
        return (job_id if until > time.time() else None), entry.revision

    async def claim(self, key: str, job_id: str, ttl: float) -> str | None:
        """Claim ``key`` for ``job_id``: None when claimed, else the id of the job holding
        it (a live claim, or a completion record)."""
        done, _ = await self._live(f"done.{key}")
        if done is not None:
            return done
        name = kv_key(f"key.{key}")
        for _ in range(3):
            holder, revision = await self._live(f"key.{key}")
            if holder is not None:
                return holder
            try:
                if revision is None:
                    await self._kv.create(name, _value(job_id, ttl))
                else:
                    await self._kv.update(name, _value(job_id, ttl), last=revision)
                return None
            except KeyWrongLastSequenceError:
                continue  # another producer wrote it first: read who
        holder, _ = await self._live(f"key.{key}")
        return holder or job_id

    async def complete(self, key: str, job_id: str, ttl: float) -> None:
        await self._kv.put(kv_key(f"done.{key}"), _value(job_id, ttl))

    async def completed(self, key: str) -> bool:
        done, _ = await self._live(f"done.{key}")
        return done is not None
