"""What the parts of ``SQSBroker`` share: the state they read and write (declared here, set by
``SQSBroker.__init__`` in broker.py), the messages this process holds, and the SQS calls every
part makes (batched deletes and visibility changes included)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from ...lease import LeaseBackend
from ..base import Broker
from ..memory import MemoryLeaseBackend
from ._batching import _Batcher
from ._errors import _request


@dataclass(slots=True)
class _Held:
    """A message this process received and has not settled."""

    receipt: str
    key: str | None  # the job's lease key, None when the body is not a job
    count: int  # ApproximateReceiveCount
    received: float  # time.monotonic() at receive
    visible_until: float  # monotonic time its visibility runs out
    token: str | None = None  # the lease token of the holder running it


def _local_locks() -> LeaseBackend:
    return MemoryLeaseBackend()


class _SQSBase(Broker):
    """The base of SQSBroker's parts (producing, consuming, leases, dead letters)."""

    # Set by SQSBroker.__init__; what only one part uses is declared in that part.
    queue_url: str
    visibility: int | None
    default_task: str | None
    fifo: bool
    max_receives: int | None
    _lease_visibility: int | None
    _lease_prefix: str
    _client: Any
    _batchers: dict[tuple[str, str], _Batcher]
    _background: set[asyncio.Task[None]]
    _held: dict[str, _Held]  # message id -> the message as received
    _keys: dict[str, str]  # job lease key -> the message id of the job's holder

    async def _ensure(self) -> Any:
        if self._client is None:
            await self.connect()
        return self._client

    async def _call(self, op: str, **params: Any) -> dict[str, Any]:
        return await _request(await self._ensure(), op, **params)

    def _batcher(self, kind: str, url: str) -> _Batcher:
        batcher = self._batchers.get((kind, url))
        if batcher is None:
            if kind == "delete":
                batcher = _Batcher(
                    lambda entries: self._call(
                        "delete_message_batch", QueueUrl=url, Entries=entries
                    ),
                    lambda e: self._call("delete_message", QueueUrl=url, **e),
                    linger=0.005,
                )
            else:
                batcher = _Batcher(
                    lambda entries: self._call(
                        "change_message_visibility_batch", QueueUrl=url, Entries=entries
                    ),
                    lambda e: self._call("change_message_visibility", QueueUrl=url, **e),
                    linger=0.001,
                )
            self._batchers[(kind, url)] = batcher
        return batcher

    async def _delete(self, receipt: str, url: str | None = None) -> bool:
        return await self._batcher("delete", url or self.queue_url).submit(
            {"ReceiptHandle": receipt}
        )

    async def _set_visibility(self, receipt: str, seconds: int, url: str | None = None) -> bool:
        entry = {"ReceiptHandle": receipt, "VisibilityTimeout": seconds}
        return await self._batcher("visibility", url or self.queue_url).submit(entry)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _receive_visibility(self) -> int | None:
        return self.visibility if self.visibility is not None else self._lease_visibility

    def _forget(self, mid: str) -> _Held | None:
        held = self._held.pop(mid, None)
        if held is not None and held.key is not None and self._keys.get(held.key) == mid:
            del self._keys[held.key]
        return held
