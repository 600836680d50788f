"""Lua scripts: read once from ``aqw/_redis/lua/*.lua`` and called by SHA (EVALSHA).

A script missing from the server's cache (after a restart or ``SCRIPT FLUSH``) is loaded and
the call retried once.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError


class Script:
    """One Lua script, identified by the SHA1 of its source."""

    __slots__ = ("_head", "name", "sha", "source")

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        # The SHA as bytes, sent as it is instead of encoded on every call. The command name
        # stays a str: the cluster client routes a script call by it.
        self._head = ("EVALSHA", self.sha.encode())

    def args(self, keys: list[str], argv: list[Any]) -> tuple[Any, ...]:
        """The EVALSHA command for ``keys`` and ``argv``."""
        return (*self._head, len(keys), *keys, *argv)

    async def __call__(self, client: Redis, keys: list[str], argv: list[Any]) -> Any:
        execute: Any = client.execute_command
        try:
            return await execute(*self.args(keys, argv))
        except NoScriptError:
            await client.script_load(self.source)
            return await execute(*self.args(keys, argv))

    def __repr__(self) -> str:
        return f"Script({self.name!r}, sha={self.sha[:8]})"


def ms(seconds: float) -> int:
    """``seconds`` in whole milliseconds, at least 1 (a PX of 0 is an error): how scripts
    take durations."""
    return max(1, int(seconds * 1000))


@cache
def load(name: str) -> Script:
    """The script ``aqw/_redis/lua/<name>.lua``, read once per process."""
    source = resources.files("aqw._redis").joinpath("lua", f"{name}.lua").read_text("utf-8")
    return Script(name, source)
