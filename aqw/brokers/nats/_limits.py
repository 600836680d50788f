"""Rate limits and per-key caps of a queue on JetStream, shared by every worker: the same
rules as the other brokers' start step (GCRA, and caps counted over the holders' live
leases), each a key of the queue's ``AQW_q_STATE`` bucket written by compare-and-set on
its revision (``update(last=...)``; ``create`` for a new one), read again and retried when
another process wrote it first.

- ``rate.<bucket>``: ``"<tat> <promised>"`` in microseconds: the theoretical arrival time,
  and the turn last promised to a refused start (refused starts are spread over the turns
  to come, not all sent back at the same instant).
- ``slots.<cap key>``: a JSON list of ``[lease key, token]``, one per holder; a holder
  counts while its lease key is still held by its token (``KvLeaseBackend.owner``), so a
  holder's release or a crashed holder's expired lease frees its slot with no write here.

The start step (``NatsStart``) takes the job's lease first, then the cap slots, then the
rate turn: a refusal releases the lease, which also frees the slots it took, so a refused
start holds nothing. A start refused after its rate turn was taken (its record ended
meanwhile) spends that turn."""

from __future__ import annotations

import asyncio
import json
import random
import time

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from ...errors import RateLimited
from ...flow import Limits, cap_wait, rate_wait
from ._leases import KvLeaseBackend, kv_key

#: Compare-and-set attempts on one key before a start gives up (refused as over the limit:
#: that many other starts wrote it meanwhile).
TRIES = 8


def _now_us() -> int:
    return int(time.time() * 1e6)


class KvLimiter:
    """The rate turns and cap slots of one queue, in its state bucket (module docstring)."""

    __slots__ = ("_kv", "_leases")

    def __init__(self, kv: KeyValue, leases: KvLeaseBackend) -> None:
        self._kv = kv
        self._leases = leases

    async def _read(self, key: str) -> tuple[bytes, int | None]:
        """(value, revision) of ``key``; (b"", None) when it has none."""
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError:
            return b"", None
        return entry.value or b"", entry.revision

    async def _write(self, key: str, value: bytes, last: int | None) -> bool:
        """Write ``value`` when ``key`` is still at revision ``last`` (None: absent)."""
        try:
            if last is None:
                await self._kv.create(key, value)
            else:
                await self._kv.update(key, value, last=last)
        except KeyWrongLastSequenceError:
            return False
        return True

    async def refusal(self, limits: Limits, lease_key: str, token: str) -> RateLimited | None:
        """Take a slot in each cap of ``limits`` and a turn of its rate for the holder of
        ``lease_key`` (``token``), or why not (the slots taken so far free themselves
        when the caller releases the lease)."""
        for cap, most in limits.caps:
            if not await self._slot(kv_key(f"slots.{cap}"), most, lease_key, token):
                return RateLimited(cap_wait(0, random.random()), reason="concurrency")
        if limits.bucket is not None:
            return await self._turn(kv_key(f"rate.{limits.bucket}"), limits)
        return None

    async def _slot(self, key: str, most: int, lease_key: str, token: str) -> bool:
        for _ in range(TRIES):
            raw, last = await self._read(key)
            try:
                held = [(str(k), str(t)) for k, t in json.loads(raw)] if raw else []
            except (ValueError, TypeError):
                held = []  # damaged: counted empty, rewritten whole
            others = [(k, t) for k, t in held if k != lease_key]
            owners = await asyncio.gather(*(self._leases.owner(k) for k, _ in others))
            live = [h for h, owner in zip(others, owners, strict=True) if owner == h[1]]
            if len(live) >= most:
                return False
            value = json.dumps([*live, (lease_key, token)]).encode()
            if await self._write(key, value, last):
                return True
        return False

    async def _turn(self, key: str, limits: Limits) -> RateLimited | None:
        for _ in range(TRIES):
            raw, last = await self._read(key)
            try:
                tat, promised = (int(n) for n in raw.split())
            except ValueError:
                tat = promised = 0
            now = _now_us()
            if tat - limits.tolerance_us > now:
                turn = max(tat - limits.tolerance_us, promised)
                value = f"{tat} {turn + limits.interval_us}".encode()
                if await self._write(key, value, last):
                    return RateLimited(rate_wait(turn - now), reason="rate_limit")
                continue
            value = f"{max(tat, now) + limits.interval_us} {promised}".encode()
            if await self._write(key, value, last):
                return None
        return RateLimited(rate_wait(limits.interval_us), reason="rate_limit")
