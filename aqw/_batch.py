"""Automatic pipelining: commands issued by many tasks in the same moment share one round trip.

Each caller awaits its own result, but the commands queued while a pipeline is in flight go
out together in the next one. Under load this turns N round trips into one; when idle a lone
command is sent at once, so latency does not suffer.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from ._scripts import Script

_Pending = tuple[tuple[Any, ...], "asyncio.Future[Any]", Script | None]


class CommandBatcher:
    """Sends the commands queued by concurrent callers as one pipeline per round trip."""

    def __init__(self, client: Redis, max_batch: int = 512) -> None:
        self.client = client
        self.max_batch = max_batch
        self._queue: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None

    def execute(self, *args: Any) -> asyncio.Future[Any]:
        """Queue one command; the future resolves to its reply (or its error)."""
        return self._enqueue(args, None)

    def script(self, script: Script, keys: list[str], argv: list[Any]) -> asyncio.Future[Any]:
        """Queue one EVALSHA; a ``NOSCRIPT`` reply loads the script and retries the call."""
        return self._enqueue(script.args(keys, argv), script)

    def _enqueue(self, args: tuple[Any, ...], script: Script | None) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((args, fut, script))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_loop())
        return fut

    async def _flush_loop(self) -> None:
        while self._queue:
            batch = self._queue[: self.max_batch]
            del self._queue[: self.max_batch]
            try:
                await self._send(batch)
            except BaseException as exc:  # also on cancellation: no caller may hang
                for _, fut, _ in batch:
                    if not fut.done():
                        fut.set_exception(_as_exception(exc))
                if isinstance(exc, asyncio.CancelledError):
                    self._fail_queue(exc)
                    raise

    async def _send(self, batch: list[_Pending]) -> None:
        replies = await self._pipeline([args for args, _, _ in batch])
        missing: list[tuple[Script, _Pending]] = []
        for item, reply in zip(batch, replies, strict=True):
            _, fut, script = item
            if fut.done():
                continue
            if isinstance(reply, NoScriptError) and script is not None:
                missing.append((script, item))
            elif isinstance(reply, Exception):
                fut.set_exception(reply)
            else:
                fut.set_result(reply)
        if missing:
            for source in {s.source for s, _ in missing}:
                await self.client.script_load(source)
            retried = [item for _, item in missing]
            replies = await self._pipeline([args for args, _, _ in retried])
            for (_, fut, _), reply in zip(retried, replies, strict=True):
                if fut.done():
                    continue
                if isinstance(reply, Exception):
                    fut.set_exception(reply)
                else:
                    fut.set_result(reply)

    async def _pipeline(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        if len(commands) == 1:
            try:
                execute: Any = self.client.execute_command
                return [await execute(*commands[0])]
            except NoScriptError as exc:
                return [exc]
            except Exception as exc:
                if _is_reply_error(exc):
                    return [exc]
                raise
        pipe = self.client.pipeline(transaction=False)
        for args in commands:
            pipe.execute_command(*args)
        return list(await pipe.execute(raise_on_error=False))

    def _fail_queue(self, exc: BaseException) -> None:
        queued, self._queue = self._queue, []
        for _, fut, _ in queued:
            if not fut.done():
                fut.set_exception(_as_exception(exc))


def _is_reply_error(exc: Exception) -> bool:
    from redis.exceptions import ConnectionError, ResponseError, TimeoutError

    return isinstance(exc, ResponseError) and not isinstance(exc, ConnectionError | TimeoutError)


def _as_exception(exc: BaseException) -> BaseException:
    if isinstance(exc, asyncio.CancelledError):
        return ConnectionAbortedError("the command batch was cancelled before its reply")
    return exc
