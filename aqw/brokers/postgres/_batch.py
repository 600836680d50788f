"""Micro-batches: the calls made while one round trip is on its way go out together in the
next one (no timer: a lone call goes at once). The acks of many jobs then cost one
statement and one commit instead of one each."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

A = TypeVar("A")
R = TypeVar("R")

#: Most calls in one batch.
MAX_BATCH = 500
#: Times a batch the server broke out of a lock cycle (SQLSTATE 40P01, nothing of it written)
#: goes again before its callers get the error. Starts and settles lock a job's record, lease
#: and row in one order, so a cycle is not expected; a batch is still never failed for one.
DEADLOCK_RETRIES = 3


class Batcher(Generic[A, R]):
    """Runs ``run(args)`` for the calls waiting, a result per call, in order."""

    def __init__(self, run: Callable[[Sequence[A]], Awaitable[Sequence[R]]]) -> None:
        self._run = run
        self._pending: list[tuple[A, asyncio.Future[R]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def submit(self, args: A) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((args, future))
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        try:
            await asyncio.sleep(0)  # the calls of this loop iteration join the first batch
            while self._pending:
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                try:
                    results = await self._run_again_after_deadlocks([args for args, _ in batch])
                except BaseException as exc:  # each caller gets the error (or the stop)
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._flusher = None
            for _, future in self._pending:  # cancelled with calls waiting
                if not future.done():
                    future.set_exception(ConnectionError("the broker was closed"))
            self._pending = []

    async def _run_again_after_deadlocks(self, args: Sequence[A]) -> Sequence[R]:
        for _ in range(DEADLOCK_RETRIES):
            try:
                return await self._run(args)
            except Exception as exc:
                if getattr(exc, "sqlstate", None) != "40P01":
                    raise
        return await self._run(args)


def shard() -> int:
    """A stats row of 16, at random: concurrent settles rarely meet on one."""
    return random.randrange(16)
