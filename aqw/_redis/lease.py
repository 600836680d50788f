"""The Redis lease backend: ``SET NX PX`` with a token and an ``INCR`` fencing token in one
script, compare-token renewal and release, and a fencing counter that cannot be wedged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from ..errors import ConfigError, FenceCorrupted
from . import scripts
from .batch import CommandBatcher
from .cluster import hash_slot, is_cluster, same_slot_fence_key


class RedisLeaseBackend:
    """Leases in Redis. The fencing counter of a key lives at ``fence_key`` (or ``<key>:fence``;
    on a cluster in the key's own slot, see ``fence_key``)."""

    #: The last fencing token handed out: the scripts refuse to count past it (Lua numbers
    #: are doubles, exact up to 2^53).
    FENCE_LIMIT = 2**53 - 1
    #: The prefix of the scripts' error reply for a damaged or exhausted counter.
    FENCE_ERROR = "AQWFENCE"

    def __init__(
        self, client: Redis | CommandBatcher, fence_key: str | Callable[[str], str] | None = None
    ) -> None:
        self._client = client
        self._fence_key = fence_key
        target = client.client if isinstance(client, CommandBatcher) else client
        self._cluster = is_cluster(target)
        self._acquire = scripts.load("lease_acquire")
        self._acquire_many = scripts.load("lease_acquire_many")
        self._renew = scripts.load("lease_renew")
        self._release = scripts.load("lease_release")

    def fence_key(self, key: str) -> str:
        """The fencing counter of ``key``: the ``fence_key`` given, else ``<key>:fence``; on a
        cluster, ``cluster.same_slot_fence_key`` (``{<key>}:fence`` for an untagged key), and
        a ``ConfigError`` for a counter outside the key's slot (the script would fail with
        ``CROSSSLOT``)."""
        if self._fence_key is None:
            return same_slot_fence_key(key) if self._cluster else f"{key}:fence"
        fence = self._fence_key if isinstance(self._fence_key, str) else self._fence_key(key)
        if self._cluster and hash_slot(fence) != hash_slot(key):
            raise ConfigError(
                f"lease key {key!r} and its fencing counter {fence!r} are in different "
                "cluster slots: give both the same hash tag"
            )
        return fence

    async def _run(self, script: scripts.Script, keys: list[str], argv: list[Any]) -> Any:
        if isinstance(self._client, CommandBatcher):
            return await self._client.script(script, keys, argv)
        return await script(self._client, keys, argv)

    async def acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        """Raises ``FenceCorrupted`` (and writes nothing) when the fencing counter is not an
        integer or has reached ``FENCE_LIMIT``."""
        fence_key = self.fence_key(key)
        try:
            if isinstance(self._client, CommandBatcher) and isinstance(self._fence_key, str):
                # Leases sharing one fencing counter, taken at the same moment, go in one call.
                fence = await self._client.merged(
                    self._acquire_many, (self._fence_key,), (), (key,), (token, ttl_ms)
                )
                return int(fence) or None
            fence = await self._run(self._acquire, [key, fence_key], [token, ttl_ms])
        except ResponseError as exc:
            message = str(exc)
            if not message.startswith(self.FENCE_ERROR):
                raise
            value = message.rpartition("exhausted: ")[2] or "unknown"
            raise FenceCorrupted(fence_key, value) from None
        return None if fence is None else int(fence)

    @classmethod
    def fence_damage(cls, value: bytes | str | None) -> str | None:
        """Why a fencing counter's value would make acquisitions fail (the scripts' check),
        or None when it is fine (absent counts as 0)."""
        if value is None:
            return None
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        if text != "0" and not (text.isascii() and text.isdigit() and text[0] != "0"):
            return f"{text[:40]!r} is not a non-negative integer"
        if len(text) > 16 or int(text) + 1 > cls.FENCE_LIMIT:
            return f"{text[:40]!r} is exhausted (fencing tokens stop at {cls.FENCE_LIMIT})"
        return None

    async def renew(self, key: str, token: str, ttl_ms: int) -> bool:
        """Through a batcher, by its priority lane: a renewal never waits behind other
        commands' round trip."""
        if isinstance(self._client, CommandBatcher):
            return bool(await self._client.priority.script(self._renew, [key], [token, ttl_ms]))
        return bool(await self._run(self._renew, [key], [token, ttl_ms]))

    async def release(self, key: str, token: str) -> bool:
        return bool(await self._run(self._release, [key], [token]))
