"""The aioboto3 SQS client of one broker (``Connection``): opened once, on first use (a
set-up mistake, such as no region, raised as one line: ``set_up_mistake``); the batched
DeleteMessage and ChangeMessageVisibility calls on it; the background tasks it runs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import aioboto3
from aiobotocore.config import AioConfig

from ._batching import Batcher
from ._errors import broker_name, request, set_up_mistake
from ._limits import MAX_WAIT

#: Run on a new client before anyone may use it, with the exit stack that closes it (for
#: what must close with it): ``SQSBroker`` resolves its queues and opens its lock store.
Setup = Callable[[Any, contextlib.AsyncExitStack], Awaitable[None]]


class Connection:
    """One SQS client (``pool`` HTTP connections) and its batchers, per kind and queue URL.
    ``connect`` is idempotent and concurrent callers share one attempt; every call connects
    first when needed. A failed ``setup`` closes the new client again."""

    def __init__(
        self,
        *,
        region: str | None,
        endpoint_url: str | None,
        pool: int,
        setup: Setup,
        queue: str | None = None,
    ) -> None:
        self.queue = queue  # names the broker in set-up errors
        self.region = region
        self.endpoint_url = endpoint_url
        self.pool = pool
        self.client: Any = None  # None until connected
        self.batchers: dict[tuple[str, str], Batcher] = {}  # (kind, queue URL) -> its batcher
        self._setup = setup
        self._stack: contextlib.AsyncExitStack | None = None
        self._connecting: asyncio.Lock | None = None
        self._background: set[asyncio.Task[None]] = set()

    async def connect(self) -> None:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self.client is not None:
                return
            stack = contextlib.AsyncExitStack()
            config = AioConfig(
                max_pool_connections=self.pool,
                connect_timeout=5,
                read_timeout=MAX_WAIT + 10,
                retries={"max_attempts": 3, "mode": "standard"},
            )
            try:
                client = await stack.enter_async_context(
                    aioboto3.Session().client(
                        "sqs",
                        region_name=self.region,
                        endpoint_url=self.endpoint_url,
                        config=config,
                    )
                )
            except Exception as exc:  # no region, a malformed endpoint: one line, not botocore's
                await stack.aclose()
                mistake = set_up_mistake(exc, broker_name(self.queue))
                if mistake is None:
                    raise
                raise mistake from exc
            try:
                await self._setup(client, stack)  # its requests name their queue in errors
            except BaseException:
                await stack.aclose()
                raise
            self.batchers = {}
            self.client, self._stack = client, stack

    async def ensure(self) -> Any:
        """The client, connecting first if needed."""
        if self.client is None:
            await self.connect()
        return self.client

    async def call(self, op: str, **params: Any) -> dict[str, Any]:
        return await request(await self.ensure(), op, **params)

    async def delete(self, receipt: str, url: str) -> bool:
        """Delete a message (batched); False when SQS no longer accepts the receipt."""
        return await self._batcher("delete", url).submit({"ReceiptHandle": receipt})

    async def set_visibility(self, receipt: str, seconds: int, url: str) -> bool:
        """Change a message's visibility (batched); False when the receipt is gone."""
        entry = {"ReceiptHandle": receipt, "VisibilityTimeout": seconds}
        return await self._batcher("visibility", url).submit(entry)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in the background; ``close`` waits for it (a while)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        """Send what the batchers hold, wait for the background tasks (cancelled after a long
        poll and a margin), then close the client."""
        for batcher in list(self.batchers.values()):
            await batcher.drain()
        if self._background:
            _, pending = await asyncio.wait(set(self._background), timeout=MAX_WAIT + 5)
            for task in pending:
                task.cancel()
        if self._stack is not None:
            await self._stack.aclose()
        self.client, self._stack, self.batchers = None, None, {}

    def _batcher(self, kind: str, url: str) -> Batcher:
        batcher = self.batchers.get((kind, url))
        if batcher is None:
            if kind == "delete":
                batcher = Batcher(
                    lambda entries: self.call(
                        "delete_message_batch", QueueUrl=url, Entries=entries
                    ),
                    lambda e: self.call("delete_message", QueueUrl=url, **e),
                    linger=0.005,
                )
            else:
                batcher = Batcher(
                    lambda entries: self.call(
                        "change_message_visibility_batch", QueueUrl=url, Entries=entries
                    ),
                    lambda e: self.call("change_message_visibility", QueueUrl=url, **e),
                    linger=0.001,
                )
            self.batchers[(kind, url)] = batcher
        return batcher
