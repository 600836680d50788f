"""Limits changed at run time (``aqw limits set``, ``app.limits``), as workers read them:
the store's map of ``rate:<task>`` / ``rate:<task>:<key>`` -> ``"20/s"`` and ``cap:<task>``
-> ``"3"`` (``aqw.flow.with_overrides`` applies them), kept here for the in-memory broker
(``LocalRunLimits``) and cached for a broker that keeps them on a server
(``OverrideCache``: read at the worker's start, then every ``REFRESH_EVERY`` seconds once a
limited job has started, so every worker honours a change within a second)."""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable

from ..._cancel import stop_task

log = logging.getLogger("aqw.worker")

#: Seconds between two reads of the stored limits by a worker that starts limited jobs.
REFRESH_EVERY = 0.5


class OverrideCache:
    """The stored limits as this process last read them, read again in the background."""

    def __init__(self, read: Callable[[], Awaitable[dict[str, str]]]) -> None:
        self._read = read
        self.values: dict[str, str] = {}
        self._loop: asyncio.Task[None] | None = None

    async def refresh(self) -> None:
        self.values = await self._read()

    def current(self) -> dict[str, str]:
        """The limits last read; starts the background reads on the first call."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop().create_task(self._reads())
        return self.values

    async def _reads(self) -> None:
        failing = False
        while True:
            await asyncio.sleep(REFRESH_EVERY)
            try:
                await self.refresh()
                failing = False
            except Exception as exc:  # the broker briefly away: keep the last values
                if not failing:
                    log.warning("could not read the queue's run-time limits: %s", exc)
                failing = True

    async def stop(self) -> None:
        if self._loop is not None:
            await stop_task(self._loop)
            self._loop = None


class StoredRunLimits(ABC):
    """The base of a ``RunLimits`` kept on a server: ``read`` and ``write`` are the store's,
    ``refresh``, ``current`` and ``stop`` go through this process's ``OverrideCache``."""

    shared = True

    def __init__(self) -> None:
        self._cache = OverrideCache(self.read)

    @abstractmethod
    async def read(self) -> dict[str, str]:
        """The stored map, read from the server."""

    @abstractmethod
    async def write(self, name: str, value: str | None) -> None:
        """Set ``name`` to ``value`` on the server (None: remove it)."""

    async def refresh(self) -> None:
        await self._cache.refresh()

    def current(self) -> dict[str, str]:
        return self._cache.current()

    async def stop(self) -> None:
        await self._cache.stop()


class LocalRunLimits:
    """``RunLimits`` of the in-memory broker: the map itself, in this process."""

    shared = False

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    async def read(self) -> dict[str, str]:
        return dict(self.values)

    async def write(self, name: str, value: str | None) -> None:
        if value is None:
            self.values.pop(name, None)
        else:
            self.values[name] = value

    async def refresh(self) -> None:
        return None

    def current(self) -> dict[str, str]:
        return self.values

    async def stop(self) -> None:
        return None
