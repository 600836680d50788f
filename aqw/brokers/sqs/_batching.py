"""Batched DeleteMessage and ChangeMessageVisibility calls: ``Batcher``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ._errors import GONE, SQSUnavailable, error_code
from ._limits import MAX_BATCH
from ._messages import Entry


class Batcher:
    """Entries submitted within ``linger`` seconds share one ``*Batch`` call (10 at most). Each
    caller awaits its own entry: True when done, False when SQS says the receipt handle is no
    longer valid. Entries failing for another reason are retried one by one a few times."""

    def __init__(
        self,
        batch: Callable[[list[Entry]], Awaitable[dict[str, Any]]],
        one: Callable[[Entry], Awaitable[Any]],
        linger: float,
        retries: int = 3,
    ) -> None:
        self._batch, self._one, self.linger, self.retries = batch, one, linger, retries
        self._queue: list[tuple[Entry, asyncio.Future[bool]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.calls = 0

    def submit(self, entry: Entry) -> asyncio.Future[bool]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._queue.append((entry, fut))
        if len(self._queue) >= MAX_BATCH:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.linger, self._flush)
        return fut

    async def drain(self) -> None:
        self._flush()
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._queue:
            chunk = self._queue[:MAX_BATCH]
            del self._queue[:MAX_BATCH]
            self._spawn(self._send(chunk))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, chunk: list[tuple[Entry, asyncio.Future[bool]]]) -> None:
        self.calls += 1
        try:
            reply = await self._batch([{**e, "Id": str(i)} for i, (e, _) in enumerate(chunk)])
        except BaseException as exc:  # also on cancellation: no caller may hang
            error = exc if isinstance(exc, Exception) else SQSUnavailable("batch call cancelled")
            for _, fut in chunk:
                if not fut.done():
                    fut.set_exception(error)
            if not isinstance(exc, Exception):
                raise
            return
        failed = {f["Id"]: f for f in reply.get("Failed", [])}
        for i, (entry, fut) in enumerate(chunk):
            failure = failed.get(str(i))
            if fut.done():
                continue
            if failure is None:
                fut.set_result(True)
            elif failure.get("Code") in GONE:
                fut.set_result(False)
            else:
                self._spawn(self._retry_one(entry, fut, failure))

    async def _retry_one(
        self, entry: Entry, fut: asyncio.Future[bool], failure: dict[str, Any]
    ) -> None:
        error: Exception = SQSUnavailable(f"{failure.get('Code')}: {failure.get('Message')}")
        for attempt in range(self.retries):
            await asyncio.sleep(0.05 * 2**attempt)
            try:
                await self._one(entry)
            except Exception as exc:
                if error_code(exc) in GONE:
                    if not fut.done():
                        fut.set_result(False)
                    return
                error = exc
                continue
            if not fut.done():
                fut.set_result(True)
            return
        if not fut.done():
            fut.set_exception(error)
