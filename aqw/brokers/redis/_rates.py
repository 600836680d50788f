"""Throughput and durations of a queue on Redis (``RedisJobRates``, a shared ``JobRates``
part): one hash per minute, ``aqw:{q}:rates:m:<minute start>``, kept ``MINUTE_KEEP``
seconds, and one per hour, ``aqw:{q}:rates:h:<hour start>``, kept ``HOUR_KEEP`` seconds
(their TTLs trim them). A field is ``<task>|<outcome>`` (a count) or ``<task>|h<bucket>``
(the duration histogram). Workers add their counts with their heartbeat, in one
MULTI/EXEC: never a command per job."""

from __future__ import annotations

import time
from typing import Any

from redis.asyncio import Redis

from ..._redis.keys import QueueKeys
from ..tallies import HOUR_KEEP, MINUTE_KEEP, TaskTally
from ._entries import text

Buckets = dict[float, dict[str, TaskTally]]


def _fields(tasks: dict[str, TaskTally]) -> dict[str, int]:
    out: dict[str, int] = {}
    for task, tally in tasks.items():
        for name, n in tally.counts.items():
            out[f"{task}|{name}"] = n
        for index, n in tally.durations.items():
            out[f"{task}|h{index}"] = n
    return out


def _tallies(raw: dict[Any, Any]) -> dict[str, TaskTally]:
    out: dict[str, TaskTally] = {}
    for field, value in raw.items():
        task, _, kind = text(field).rpartition("|")
        try:
            n = int(value)
        except ValueError:
            continue  # not written by aqw: left out
        tally = out.setdefault(task, TaskTally())
        if kind.startswith("h") and kind[1:].isdigit():
            tally.durations[int(kind[1:])] = n
        elif kind:
            tally.counts[kind] = n
    return out


class RedisJobRates:
    """The rates of one queue (``RedisBroker.rates``)."""

    shared = True

    def __init__(self, client: Redis, keys: QueueKeys) -> None:
        self._client = client
        self._keys = keys

    def _key(self, hourly: bool, start: float) -> str:
        return f"{self._keys.tag}:rates:{'h' if hourly else 'm'}:{int(start)}"

    async def add(self, tallies: Buckets) -> None:
        if not tallies:
            return
        now = time.time()
        pipe = self._client.pipeline(transaction=True)
        for minute, tasks in tallies.items():
            fields = _fields(tasks)
            if not fields:
                continue
            for hourly, start, keep in (
                (False, minute, MINUTE_KEEP),
                (True, minute - minute % 3600, HOUR_KEEP),
            ):
                if start < now - keep:
                    continue  # past its keep time: it would be trimmed at once
                key = self._key(hourly, start)
                for field, n in fields.items():
                    pipe.hincrby(key, field, n)
                pipe.expire(key, int(keep))
        if len(pipe):
            await pipe.execute()

    async def read(self, since: float, hourly: bool) -> Buckets:
        step = 3600 if hourly else 60
        first = int(since - since % step)
        starts = list(range(first, int(time.time()) + 1, step))
        pipe = self._client.pipeline(transaction=False)
        for start in starts:
            pipe.hgetall(self._key(hourly, start))
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        out: Buckets = {}
        for start, raw in zip(starts, replies, strict=True):
            if isinstance(raw, dict) and raw:
                out[float(start)] = _tallies(raw)
        return out
