"""Stops that cannot be swallowed: cancel a task at a deadline and keep cancelling it until the
guarded block has exited, and check a deadline each time a handler's coroutine resumes.

One ``Task.cancel()`` is not a stop on Python 3.11: ``asyncio.wait_for`` (used by redis-py for
every send) returns a result that races a cancellation instead of raising, and a handler may
catch ``CancelledError`` by mistake. Both tools here assume the block may ignore a cancel.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, NoReturn, TypeVar

from .errors import HandlerStopped

T = TypeVar("T")

#: Seconds between repeated cancellations of a block that has not exited yet.
REPEAT = 0.01


class Canceller:
    """Cancels ``task`` once ``when`` (event-loop time) has passed, then again every ``REPEAT``
    seconds until ``close()``. The deadline can move (``move``) or fire now (``fire``).

    The timer lives in the loop's timer heap, so after a pause (SIGSTOP, a blocked loop) it
    fires in deadline order, before the block's own later timers. ``close()`` takes back every
    cancellation it made (``Task.uncancel``), so the count of the task's other cancellations
    tells whether someone else asked it to stop too."""

    __slots__ = ("_handle", "_loop", "_on_fire", "_task", "cancels", "fired", "reason")

    def __init__(
        self,
        task: asyncio.Task[Any],
        when: float | None,
        on_fire: Callable[[], None] | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = task
        self._on_fire = on_fire
        self._handle: asyncio.TimerHandle | asyncio.Handle | None = None
        self.cancels = 0
        self.fired = False
        self.reason = ""
        if when is not None:
            self.move(when)

    def move(self, when: float) -> None:
        """Cancel the task at loop time ``when`` instead (a no-op once fired or closed)."""
        if self.fired or self._task is None:
            return
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._loop.call_at(when, self._fire)

    def fire(self, reason: str = "") -> None:
        """Cancel the task now, and keep at it until ``close()``."""
        if self.fired:
            return
        if self._handle is not None:
            self._handle.cancel()
        self.reason = reason
        self._fire()

    def _fire(self) -> None:
        first = not self.fired
        self.fired = True
        if first and self._on_fire is not None:
            self._on_fire()
        if self._task.done():
            return
        self._task.cancel(self.reason or None)
        self.cancels += 1
        self._handle = self._loop.call_later(REPEAT, self._fire)

    def close(self) -> int:
        """Stop cancelling; take back this canceller's cancellations. Returns the task's count
        of cancellation requests that remain (someone else's)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        remaining = self._task.cancelling()
        for _ in range(self.cancels):
            remaining = self._task.uncancel()
        self.cancels = 0
        return remaining


#: Seconds a stopped handler may take to unwind (its ``finally`` blocks and ``async with``
#: exits may await) once it has swallowed a stop, before it is closed.
UNWIND = 1.0


class Guarded(Generic[T]):
    """Await ``coro``, but each time it is resumed first ask ``expired()``. When that answers
    a reason, stop the coroutine instead of resuming it, in steps that cannot be swallowed:

    1. throw ``CancelledError(reason)``: what asyncio code (and the libraries it calls)
       expects, and cleans up for;
    2. if it is resumed again, it swallowed that (a bare ``except CancelledError``, or, on
       Python 3.11, ``asyncio.wait_for`` returning a result that was ready as the cancel
       landed): throw ``aqw.HandlerStopped(reason)``, which ``wait_for`` cannot swallow;
    3. let it unwind for up to ``UNWIND`` seconds, then close it and raise
       ``HandlerStopped``.

    This is what stops a handler that was paused past its deadline before it runs another
    statement: the timer of a ``Canceller`` fires at the next loop iteration, but the event
    that resumes the handler can come first in that same iteration. A stop swallowed in
    step 1 lets the statements up to the handler's next ``await`` run."""

    __slots__ = ("_coro", "_expired", "_since", "_step", "stopped")

    def __init__(self, coro: Coroutine[Any, Any, T], expired: Callable[[], str | None]) -> None:
        self._coro = coro
        self._expired = expired
        self._since = 0.0
        self._step = 0
        self.stopped: str | None = None

    def __await__(self) -> Generator[Any, Any, T]:
        coro = self._coro
        value: Any = None
        error: BaseException | None = None
        while True:
            error = self._stop(error)
            try:
                if error is not None:
                    pending, error = error, None
                    step = coro.throw(pending)
                else:
                    step = coro.send(value)
            except StopIteration as done:
                result: T = done.value
                return result
            try:
                value = yield step
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # delivered by the task: pass it on
                value, error = None, exc

    def _stop(self, error: BaseException | None) -> BaseException | None:
        """What to throw into the coroutine at this resume (``error``: the task's own)."""
        if self._step == 0:
            reason = self._expired()
            if reason is None:
                return error
            self.stopped, self._step = reason, 1
            return asyncio.CancelledError(reason)
        assert self.stopped is not None
        if self._step == 1:
            self._step, self._since = 2, asyncio.get_running_loop().time()
            return HandlerStopped(self.stopped)
        if asyncio.get_running_loop().time() - self._since > UNWIND:
            self._close(self.stopped)
        return error

    def _close(self, reason: str) -> NoReturn:
        with contextlib.suppress(RuntimeError):  # it awaited while closing: nothing more to do
            self._coro.close()
        raise HandlerStopped(reason)


async def stop_task(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has ended, cancelling it again every ``REPEAT``
    seconds: a background loop's one cancel can be swallowed (``asyncio.wait_for`` on Python
    3.11, inside nats-py's watchers and reads), and a stop awaiting it then never returned.
    The caller's own cancellation is not swallowed; the task's own error is dropped (it was
    being stopped)."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=REPEAT)
    if not task.cancelled():
        task.exception()  # retrieved: a loop that failed as it stopped is no news
