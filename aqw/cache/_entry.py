"""What ``aqw.cache.Cache`` stores and checks: the entry, the Redis keys of a logical key,
the JSON encoding of values, the validation of keys, ttls and versions, and the in-process
load (flight) of one key that concurrent callers share."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_jsonable_python

from ..errors import ConfigError


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """The result of ``Cache.get``.

    Attributes:
        value: the cached value as JSON types (``None`` on a miss, or for a cached ``None``).
        version: on a hit, the version the entry was stored at; on a miss, the key's current
            version counter -- load from the datastore, then store with
            ``put(key, value, version=entry.version)``.
        hit: whether a usable entry was found.
    """

    value: Any
    version: int
    hit: bool


@dataclass(frozen=True, slots=True)
class CacheKeys:
    """The Redis keys of one logical key; they share a hash tag (Redis Cluster)."""

    entry: str
    version: str
    lock: str

    @classmethod
    def of(cls, prefix: str, key: str) -> CacheKeys:
        check_key(key)
        base = f"{prefix}:{{{key}}}"
        return cls(entry=base, version=f"{base}:ver", lock=f"{base}:lock")


class Flight:
    """One in-process load of a key, shared by every caller that joins it."""

    __slots__ = ("hit", "min_version", "task")

    def __init__(self, min_version: int) -> None:
        self.min_version = min_version
        self.hit: bool | None = None
        self.task: asyncio.Task[Any] | None = None


# -- JSON ----------------------------------------------------------------------------------


def _json_default(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    try:
        return to_jsonable_python(obj)
    except PydanticSerializationError as exc:
        raise TypeError(
            f"cache values must be JSON-serialisable, got {type(obj).__name__}"
        ) from exc


def dumps(value: Any) -> str:
    """``value`` as compact JSON; pydantic models as ``model_dump(mode="json")``.

    Raises:
        TypeError: when ``value`` is not JSON-serialisable.
    """
    return json.dumps(value, default=_json_default, separators=(",", ":"))


# -- validation ----------------------------------------------------------------------------


def check_key(key: str) -> None:
    if not isinstance(key, str) or not key:
        raise ConfigError(f"Cache key must be a non-empty string, got {key!r}")


def ttl_to_ms(ttl: float, name: str) -> int:
    """A ttl in seconds as whole milliseconds (at least 1)."""
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < math.inf:
        raise ConfigError(f"Cache {name} must be a finite number > 0 (seconds), got {ttl!r}")
    return max(1, round(ttl * 1000))


def check_version(version: int, name: str) -> None:
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ConfigError(f"Cache {name} must be an int >= 0, got {version!r}")


def check_min_version(min_version: int | None) -> int:
    """``min_version`` checked, as a floor (0 when None)."""
    if min_version is None:
        return 0
    check_version(min_version, "min_version")
    return min_version
