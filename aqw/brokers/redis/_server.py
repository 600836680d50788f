"""The Redis server a queue lives on, for operators (``RedisServer``, a ``ServerInfo``
part): its memory and eviction policy (the dashboard's health box), damage in the queue's
own keys that stops its work (``aqw status``: a fencing counter every job lease would fail
on, stats fields that are not integers, lease keys no live worker holds: ``_blocked.py``),
the commands it has run and the deletion of every
key of the queue (``aqw bench``). One part per queue; a partitioned queue's covers each of
its partitions' keys."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio import Redis

from ..._readback import shown, to_int
from ..._redis.keys import QueueKeys
from ..._redis.lease import RedisLeaseBackend
from ...job import Job
from ..messages import BlockedLease, Release
from ._blocked import blocked_leases, release_lease


class RedisServer:
    """The server of the queue whose keys are ``keys`` (one ``QueueKeys`` per partition)."""

    shared = True

    def __init__(self, client: Redis, keys: Sequence[QueueKeys]) -> None:
        self._client = client
        self._keys = tuple(keys)

    async def health(self) -> dict[str, Any]:
        """Used, peak and max memory and the eviction policy (one ``INFO memory``); raises
        what the client raised when the server has no INFO (fakeredis, or a proxy)."""
        info: Any = await self._client.info("memory")
        policy = str(info.get("maxmemory_policy", "?"))
        return {
            "error": None,
            "used": to_int(info.get("used_memory"), 0),
            "peak": to_int(info.get("used_memory_peak"), 0),
            "max": to_int(info.get("maxmemory"), 0),
            "policy": policy,
            "evicting": policy != "noeviction",
        }

    async def problems(self) -> list[str]:
        """A fencing counter that would make every job lease fail (``aqw.FenceCorrupted``),
        and stats fields that are not integers, in each partition's keys."""
        return [problem for keys in self._keys for problem in await self._damage(keys)]

    async def _damage(self, keys: QueueKeys) -> list[str]:
        out: list[str] = []
        fence = keys.fence
        if await self._type(fence) not in ("string", "none"):
            why: str | None = "not a string"
        else:
            why = RedisLeaseBackend.fence_damage(await self._client.get(fence))
        if why is not None:
            out.append(
                f"fencing counter {fence} is damaged: {why}; no job lease can be taken until "
                f"it is SET to an integer above every fencing token handed out "
                f"(below {RedisLeaseBackend.FENCE_LIMIT})"
            )
        if await self._type(keys.stats) not in ("hash", "none"):
            out.append(f"the stats key {keys.stats} is not a hash")
            return out
        cursor: Any = 0
        seen = 0
        while True:
            reply: Any = await self._client.hscan(keys.stats, cursor, count=1000)
            cursor, fields = reply
            for name, value in fields.items():
                if to_int(value, None) is None:
                    out.append(
                        f"damaged counter {shown(name)} in {keys.stats}: "
                        f"{shown(value)} is not an integer"
                    )
            seen += len(fields)
            if not int(cursor) or seen >= 1000 or len(out) >= 20:
                break
        return out

    async def _type(self, key: str) -> str:
        """The Redis type of ``key`` (``none`` when it does not exist)."""
        kind: Any = await self._client.type(key)
        return kind.decode() if isinstance(kind, bytes) else str(kind)

    async def commands_run(self) -> int | None:
        """Commands the server has run so far, from ``INFO commandstats`` (None without it)."""
        try:
            info: Any = await self._client.info("commandstats")
        except Exception:
            return None
        return sum(
            int(v.get("calls", 0))
            for k, v in info.items()
            if k.startswith("cmdstat_") and k != "cmdstat_info"
        )

    async def _scan(self) -> list[Any]:
        found: list[Any] = []
        for keys in self._keys:
            found += [k async for k in self._client.scan_iter(match=keys.pattern(), count=1000)]
        return found

    async def count_keys(self) -> int:
        """SCAN for the keys of the queue (of each partition)."""
        return len(await self._scan())

    async def delete_queue(self) -> int:
        """SCAN and DEL every key of the queue (of each partition); how many went."""
        found = await self._scan()
        for i in range(0, len(found), 500):
            await self._client.delete(*found[i : i + 500])
        return len(found)

    async def blocked_leases(
        self, lease_ttl: Callable[[Job | None], float], limit: int = 20
    ) -> list[BlockedLease]:
        """Jobs blocked by a lease key no live worker holds, in every partition."""
        return await blocked_leases(self._client, self._keys, lease_ttl, limit)

    async def release_lease(self, job_id: str) -> Release:
        """``aqw job release``: in the partition the job id names."""
        return await release_lease(self._client, self._keys, job_id)
