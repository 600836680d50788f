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


#: The scripts safe to send again after a call's reply was lost with its connection
#: (``client.repeatable``): a second run leaves what one run leaves and tells the caller
#: the same. ``result_watch`` reads a record and adds an inbox to a set; ``cancel`` changes
#: nothing the second time (its reply then reads "finished" for a job the lost call
#: cancelled: the record says cancelled either way). Never an enqueue (a second XADD is a
#: second job), a settle step (its second run is refused: the worker would take its own
#: settle for a lost lease), a fetch or a lease step (each has its own rules).
REPEATABLE = frozenset({"cancel", "result_watch"})
#: The SHAs of the ``REPEATABLE`` scripts loaded so far, as sent (bytes).
REPEATABLE_SHAS: set[bytes] = set()


#: A line of a script replaced by the named file's text: shared functions (batch_lib.lua).
INCLUDE = "--@include "


def _source(name: str) -> str:
    text = resources.files("aqw._redis").joinpath("lua", f"{name}.lua").read_text("utf-8")
    if INCLUDE not in text:
        return text
    return "".join(
        _source(line[len(INCLUDE) :].strip()) if line.startswith(INCLUDE) else line
        for line in text.splitlines(keepends=True)
    )


@cache
def load(name: str) -> Script:
    """The script ``aqw/_redis/lua/<name>.lua``, read once per process (with the files its
    ``--@include <name>`` lines name in their place)."""
    script = Script(name, _source(name))
    if name in REPEATABLE:
        REPEATABLE_SHAS.add(script.sha.encode())
    return script
