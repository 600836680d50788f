"""Wake-ups that belong to no event loop: the in-process queues outlive the loops that use
them (pytest-asyncio and anyio give each test a loop of its own, ``asyncio.run`` makes one
per call), so nothing they keep may bind to the loop it was first used in.

An ``asyncio.Event`` binds to the loop of its first blocking ``wait()``; a waiter here is a
future of the waiting task's own loop, made per wait and resolved in that loop, whichever
loop (or thread) wakes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def resolve(fut: asyncio.Future[T], value: T) -> None:
    """Set ``fut``'s result in its own loop: at once from that loop, through
    ``call_soon_threadsafe`` from any other (or from no loop); nothing once it is done or
    its loop is closed (its waiter went with the loop)."""
    if fut.done():
        return
    loop = fut.get_loop()
    if loop.is_closed():
        return
    try:
        here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        here = None
    if here is loop:
        fut.set_result(value)
    else:
        loop.call_soon_threadsafe(_set_if_pending, fut, value)


def call_in(loop: asyncio.AbstractEventLoop, fn: Callable[[str], None], arg: str) -> None:
    """``fn(arg)`` in ``loop``: now from that loop, soon from any other; not at all once
    ``loop`` is closed."""
    if loop.is_closed():
        return
    try:
        here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        here = None
    if here is loop:
        fn(arg)
    else:
        loop.call_soon_threadsafe(fn, arg)


def _set_if_pending(fut: asyncio.Future[T], value: T) -> None:
    if not fut.done():
        fut.set_result(value)


class Wakeup:
    """Tasks waiting for a change (``wait``), woken together by ``notify``, each in its own
    loop. A wait starts from now: a ``notify`` before it is not seen (check the state first,
    then wait, with no ``await`` between)."""

    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: set[asyncio.Future[None]] = set()

    async def wait(self, timeout: float) -> bool:
        """Wait for the next ``notify``, at most ``timeout`` seconds: False when none came."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(fut)
        try:
            done, _ = await asyncio.wait((fut,), timeout=max(0.0, timeout))
        finally:
            self._waiters.discard(fut)
            fut.cancel()
        return bool(done)

    def notify(self) -> None:
        """Wake every task waiting now."""
        if self._waiters:
            waiters, self._waiters = self._waiters, set()
            for fut in waiters:
                resolve(fut, None)

    def __len__(self) -> int:
        return len(self._waiters)
