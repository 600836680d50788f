"""The parts a queue shares across processes in its ``AQW_q_STATE`` bucket: worker
heartbeats (``beat.<worker>``: the summary and its expiry, as JSON) and the periodic tasks'
schedule marks (``mark.<task>``, moved only forward by compare-and-set on the revision, so
a paused ex-leader that wakes up never moves a mark back)."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from ..messages import ScheduleMark
from ._leases import kv_key


async def entries(kv: KeyValue, prefix: str) -> list[tuple[str, bytes]]:
    """(key, value) of every live key under ``prefix`` (a watch of ``prefix.>`` to the end
    of its initial values: a server of 2.9 ignores ``keys(filters=...)``). A watch whose end
    marker never comes (nats-py drops an update whose delivery beat the watch's own set-up
    by more than its timeout, as happens on a loaded machine) is started again, up to
    ``WATCH_TRIES`` times."""
    for attempt in range(WATCH_TRIES):
        try:
            return await _watch_once(kv, prefix)
        except nats.errors.TimeoutError:
            if attempt == WATCH_TRIES - 1:
                raise
    raise AssertionError("unreachable")


#: Watches ``entries`` starts before it gives up.
WATCH_TRIES = 3

_GONE = ("DEL", "PURGE")


async def _watch_once(kv: KeyValue, prefix: str) -> list[tuple[str, bytes]]:
    watcher = await kv.watch(f"{prefix}.>")
    out: list[tuple[str, bytes]] = []
    try:
        while True:
            entry = await watcher.updates(timeout=5.0)  # type: ignore[no-untyped-call]
            if entry is None:
                return out
            if entry.operation not in _GONE:
                out.append((entry.key, entry.value or b""))
            if entry.delta == 0:  # the last initial value (the marker may follow or not)
                return out
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]


#: The bucket, once the broker is connected (connecting it first when it is not).
Opener = Callable[[], Awaitable[KeyValue]]


class KvWorkerStatus:
    """Worker heartbeats in the queue's state bucket."""

    #: Every process that opens the queue sees them.
    shared = True

    def __init__(self, opener: Opener) -> None:
        self._open = opener

    async def publish_heartbeat(self, worker: str, data: dict[str, Any], ttl: float) -> None:
        value = {"until": time.time() + ttl, "data": data}
        await (await self._open()).put(kv_key(f"beat.{worker}"), json.dumps(value).encode())

    async def heartbeats(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        now = time.time()
        for key, raw in await entries(await self._open(), "beat"):
            try:
                value = json.loads(raw)
                until, data = float(value["until"]), value["data"]
            except (ValueError, KeyError, TypeError):
                out.append({"damaged_heartbeat": key})
                continue
            if until >= now and isinstance(data, dict):
                out.append(data)
        return out

    async def remove_heartbeat(self, worker: str) -> None:
        await (await self._open()).delete(kv_key(f"beat.{worker}"))


class KvScheduleMarks:
    """The schedule marks in the queue's state bucket."""

    #: Every process that opens the queue sees them.
    shared = True

    def __init__(self, opener: Opener) -> None:
        self._open = opener

    async def read(self) -> dict[str, ScheduleMark]:
        out: dict[str, ScheduleMark] = {}
        for _, raw in await entries(await self._open(), "mark"):
            task, _, text = raw.decode("utf-8", "replace").partition("\n")
            mark = ScheduleMark.decode(text)
            if mark is not None:
                out[task] = mark
        return out

    async def advance(self, task: str, mark: ScheduleMark) -> None:
        key = kv_key(f"mark.{task}")
        value = f"{task}\n{mark.encode()}".encode()
        for _ in range(10):
            try:
                entry = await (await self._open()).get(key)
            except KeyNotFoundError:
                entry = None
            try:
                if entry is None:
                    await (await self._open()).create(key, value)
                    return
                _, _, text = (entry.value or b"").decode("utf-8", "replace").partition("\n")
                current = ScheduleMark.decode(text)
                if current is not None and current.tick > mark.tick:
                    return  # a later tick is recorded: never moved back
                await (await self._open()).update(key, value, last=entry.revision)
                return
            except KeyWrongLastSequenceError:
                continue  # another scheduler wrote it: read again
