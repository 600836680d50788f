"""Automatic pipelining: commands issued by many tasks in the same moment share one round trip.

Each caller awaits its own result, but the commands queued while a pipeline is in flight go
out together in the next one. Under load this turns N round trips into one; when idle a lone
command is sent at once, so latency does not suffer.

Calls of a *mergeable* script (one written to take many items, see ``ack.lua``) queued in the
same moment are also merged into a single EVALSHA, so the server runs one script for a
hundred jobs instead of a hundred scripts.

What must not wait (lease renewals and the checks sent with them) goes by the ``priority``
lane: what is queued there in one moment goes out at once, as one pipeline on a connection
of its own, never behind a round trip already in flight (the main lane's or its own). Over a
slow link a renewal queued behind a pipelined round trip would otherwise spend two round
trips, and their stalls, of its lease's margin.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError, NoScriptError, ResponseError, TimeoutError

from .client import repeatable
from .cluster import is_cluster
from .scripts import Script

Resolver = Callable[[Any], None]


class _Call:
    __slots__ = ("args", "fut", "script")

    def __init__(self, args: tuple[Any, ...], fut: asyncio.Future[Any], script: Script | None):
        self.args, self.fut, self.script = args, fut, script


class _Item:
    __slots__ = ("argv", "fut", "group", "keys")

    def __init__(
        self,
        group: tuple[Any, ...],
        keys: Sequence[str],
        argv: Sequence[Any],
        fut: asyncio.Future[Any],
    ) -> None:
        self.group, self.keys, self.argv, self.fut = group, keys, argv, fut


class CommandBatcher:
    """Sends the commands queued by concurrent callers as one pipeline per round trip."""

    def __init__(self, client: Redis, max_batch: int = 512, *, overlap: bool = False) -> None:
        self.client = client
        self.max_batch = max_batch
        self._cluster = is_cluster(client)
        self._queue: list[_Call | _Item] = []
        self._flusher: asyncio.Task[None] | None = None
        #: Send each moment's commands at once, beside the round trips in flight.
        self._overlap = overlap
        self._sending: set[asyncio.Task[None]] = set()
        self._lane: CommandBatcher | None = self if overlap else None

    @property
    def priority(self) -> CommandBatcher:
        """The lane on the same client for what must not wait (lease renewals): the
        commands queued there in one moment go out together at once (two loop iterations
        after the first: what a renewal gathers, its keep-alive checks, joins it), each
        pipeline on its own connection from the client's pool."""
        if self._lane is None:
            self._lane = CommandBatcher(self.client, self.max_batch, overlap=True)
        return self._lane

    def execute(self, *args: Any) -> asyncio.Future[Any]:
        """Queue one command; the future resolves to its reply (or its error)."""
        return self._push(_Call(args, self._future(), None))

    def script(self, script: Script, keys: list[str], argv: list[Any]) -> asyncio.Future[Any]:
        """Queue one EVALSHA; a ``NOSCRIPT`` reply loads the script and retries the call."""
        return self._push(_Call(script.args(keys, argv), self._future(), script))

    def merged(
        self,
        script: Script,
        shared_keys: tuple[str, ...],
        shared_argv: tuple[Any, ...],
        keys: Sequence[str],
        argv: Sequence[Any],
    ) -> asyncio.Future[Any]:
        """Queue one item for a mergeable script. Items with the same script and shared
        keys/arguments queued together become one call; the script returns one reply per
        item, in order, and each future gets its own."""
        group = (script, shared_keys, shared_argv)
        fut = asyncio.get_running_loop().create_future()  # _future, inline: twice per job
        return self._push(_Item(group, keys, argv, fut))

    def _future(self) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    def _push(self, item: _Call | _Item) -> asyncio.Future[Any]:
        self._queue.append(item)
        if self._overlap:
            if len(self._queue) == 1:  # the first of this moment: it goes out with the rest
                loop = asyncio.get_running_loop()
                loop.call_soon(loop.call_soon, self._send_now)
        elif self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())
        return item.fut

    def _send_now(self) -> None:
        """The priority lane: send what is queued now, beside any round trip in flight."""
        batch, self._queue = self._queue, []
        for i in range(0, len(batch), self.max_batch):
            task = asyncio.get_running_loop().create_task(
                self._send_all(batch[i : i + self.max_batch])
            )
            self._sending.add(task)  # the loop holds tasks weakly: keep it until it is done
            task.add_done_callback(self._sending.discard)

    async def _send_all(self, batch: list[_Call | _Item]) -> None:
        try:
            await self._send(batch)
        except BaseException as exc:  # also on cancellation: no caller may hang
            for item in batch:
                if not item.fut.done():
                    item.fut.set_exception(_as_exception(exc))
            if isinstance(exc, asyncio.CancelledError):
                raise

    async def _flush_loop(self) -> None:
        while self._queue:
            batch = self._queue[: self.max_batch]
            del self._queue[: self.max_batch]
            try:
                await self._send(batch)
            except BaseException as exc:  # also on cancellation: no caller may hang
                for item in batch:
                    if not item.fut.done():
                        item.fut.set_exception(_as_exception(exc))
                if isinstance(exc, asyncio.CancelledError):
                    for item in self._queue:
                        if not item.fut.done():
                            item.fut.set_exception(_as_exception(exc))
                    self._queue = []
                    raise

    async def _send(self, batch: list[_Call | _Item]) -> None:
        wire: list[tuple[tuple[Any, ...], Script | None, Resolver]] = []
        groups: dict[tuple[Any, ...], list[_Item]] = {}
        for item in batch:
            if isinstance(item, _Item):
                groups.setdefault(item.group, []).append(item)
            else:  # sent even if its caller stopped waiting: a settle step must still happen
                wire.append((item.args, item.script, _resolve_one(item.fut)))
        for (script, shared_keys, shared_argv), items in groups.items():
            keys = list(shared_keys)
            argv = list(shared_argv)
            for it in items:
                keys.extend(it.keys)
                argv.extend(it.argv)
            wire.append((script.args(keys, argv), script, _resolve_many(items)))
        replies = await self._pipeline([args for args, _, _ in wire])
        missing = []
        for command, reply in zip(wire, replies, strict=True):
            if isinstance(reply, NoScriptError) and command[1] is not None:
                missing.append(command)
            else:
                command[2](reply)
        if missing:
            for source in {script.source for _, script, _ in missing if script is not None}:
                await self.client.script_load(source)
            replies = await self._pipeline([args for args, _, _ in missing])
            for (_, _, resolve), reply in zip(missing, replies, strict=True):
                resolve(reply)

    async def _pipeline(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        if len(commands) == 1:
            execute: Any = self.client.execute_command
            try:
                return [await execute(*commands[0])]
            except ResponseError as exc:
                if isinstance(exc, ConnectionError | TimeoutError):
                    raise
                return [exc]
        pipe = self._pipe(commands)
        if not self._cluster:
            try:
                return list(await pipe.execute(raise_on_error=False))
            except ConnectionError:
                # A pipeline of reads only is sent once more, on a new connection, as
                # ``RepeatingRedis`` does for one command; one with a write in it is not.
                if not all(repeatable(args) for args in commands):
                    raise
            return list(await self._pipe(commands).execute(raise_on_error=False))
        try:
            replies = list(await pipe.execute(raise_on_error=False))
        except (ConnectionError, TimeoutError):
            await self._after_lost_node()
            raise
        if any(isinstance(r, ConnectionError | TimeoutError) for r in replies):
            await self._after_lost_node()
        return replies

    def _pipe(self, commands: list[tuple[Any, ...]]) -> Any:
        pipe = self.client.pipeline(transaction=False)
        for args in commands:
            pipe.execute_command(*args)
        return pipe

    async def _after_lost_node(self) -> None:
        """A cluster pipeline whose node failed leaves redis-py's slot map as it was
        (a single command marks it stale, a pipeline does not), so a process that only
        pipelines would keep writing to a dead master after its replica took over. Closing
        the client's connections makes the next command read the slots again, as redis-py
        does itself on ``CLUSTERDOWN``; commands blocked meanwhile fail and are retried."""
        with contextlib.suppress(Exception):
            await self.client.aclose()


def _resolve_one(fut: asyncio.Future[Any]) -> Resolver:
    def resolve(reply: Any) -> None:
        if fut.done():
            return
        if isinstance(reply, Exception):
            fut.set_exception(reply)
        else:
            fut.set_result(reply)

    return resolve


def _resolve_many(items: list[_Item]) -> Resolver:
    def resolve(reply: Any) -> None:
        for i, it in enumerate(items):
            if it.fut.done():
                continue
            if isinstance(reply, Exception):
                it.fut.set_exception(reply)
            else:
                it.fut.set_result(reply[i])

    return resolve


def _as_exception(exc: BaseException) -> BaseException:
    if isinstance(exc, asyncio.CancelledError):
        return ConnectionAbortedError("the command batch was cancelled before its reply")
    return exc
