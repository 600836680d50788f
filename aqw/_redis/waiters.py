"""Waiting for jobs to end without polling, many waiters on one blocked connection.

Each waiting ``RedisBroker`` has an inbox, ``aqw:{q}:inbox:<uuid>`` (a list). To wait for a
job, ``result_watch.lua`` reads the job's record and, in the same step, adds the inbox to the
job's waiters set ``aqw:{q}:waiters:<id>``; the script that ends the job (ack, dead_letter,
cancel) pushes the job id to every inbox in that set and deletes it. One listener task per
broker blocks on the inbox (``BLPOP``, then ``LPOP`` with a count takes the rest: blocking
``BLPOP`` wakes up on fakeredis too, where ``BLMOVE`` does not) and resolves the
futures of the ids it pops: a thousand waiters cost one blocked connection, and no command
while they wait besides their registration.

The listener starts with the first waiter and stops at the end of the block during which the
last one left (at most ``LISTEN_BLOCK`` seconds later; a blocked pop is never cancelled, so no
popped id can be lost on the way: a wait that starts meanwhile reuses it). After a connection
error it retries with backoff while waiters remain, and then reads the state of every awaited
job once, since a reply lost with the connection may have carried their ids.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from .._cancel import stop_task
from ..errors import UnknownJob
from ..record import FINAL_STATES, JobInfo
from . import scripts
from .batch import CommandBatcher
from .keys import QueueKeys

log = logging.getLogger("aqw.redis")

#: Seconds one blocked pop of the listener lasts (below the client's socket timeout,
#: ``MAX_BLOCK + 10`` s, see ``client.py``).
LISTEN_BLOCK = 2.0
#: Most ids one pop takes.
POP_COUNT = 1000
#: Backoff of the listener after an error: first and longest pause, in seconds.
BACKOFF_FIRST = 0.05
BACKOFF_MAX = 2.0


def as_text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def job_info(job_id: str, queue: str, raw: Mapping[Any, Any] | None) -> JobInfo | None:
    """A record read with HGETALL as a ``JobInfo``, or None when there is none."""
    if not raw:
        return None
    return JobInfo.from_fields(job_id, queue, {as_text(k): as_text(v) for k, v in raw.items()})


class JobWaiters:
    """The jobs this process waits for, on one queue, and the listener of its inbox."""

    def __init__(self, client: Redis, batcher: CommandBatcher, keys: QueueKeys) -> None:
        self._client = client
        self._batcher = batcher
        self._keys = keys
        self.inbox = keys.inbox(uuid.uuid4().hex)
        self._watch = scripts.load("result_watch")
        self._futures: dict[str, set[asyncio.Future[None]]] = {}
        self._listener: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        """How many jobs are awaited."""
        return len(self._futures)

    @property
    def listening(self) -> bool:
        return self._listener is not None and not self._listener.done()

    async def read(self, job_id: str) -> JobInfo | None:
        """The job's record (None: none, or the key holds another type than a hash)."""
        try:
            raw = await self._batcher.execute("HGETALL", self._keys.record(job_id))
        except ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            return None
        return job_info(job_id, self._keys.queue, raw)

    async def wait(self, job_id: str, timeout: float | None) -> JobInfo:
        """The job's record once it has ended (``Broker.wait_finished``)."""
        record, waiters = self._keys.record(job_id), self._keys.waiters(job_id)
        async with asyncio.timeout(timeout):
            while True:
                # Expected before registering: a running listener may pop the id as soon as
                # the script has run.
                fut = self._add(job_id)
                registered = False
                try:
                    reply = await self._batcher.merged(
                        self._watch, (), (self.inbox,), (record, waiters), ()
                    )
                    if int(reply) == 0:
                        raise UnknownJob(job_id, self._keys.queue)
                    registered = int(reply) == 2
                    if registered:
                        self._listen_on()
                        await fut
                finally:
                    self._discard(job_id, fut, registered)
                info = await self.read(job_id)
                if info is None:
                    raise UnknownJob(job_id, self._keys.queue)
                if info.finished:
                    return info
                # Woken by an old push (its job id lived before), or replayed since: again.

    def _add(self, job_id: str) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._futures.setdefault(job_id, set()).add(fut)
        return fut

    def _listen_on(self) -> None:
        """Start the listener unless it runs (the ids pushed before it pops stay in the
        inbox: a listener started after the registration misses none)."""
        if not self.listening:
            self._listener = asyncio.get_running_loop().create_task(
                self._listen(), name=f"aqw-waiters {self.inbox}"
            )

    def _discard(self, job_id: str, fut: asyncio.Future[None], registered: bool) -> None:
        waiting = self._futures.get(job_id)
        if waiting is None or fut not in waiting:
            return  # woken: the script that woke it deleted the waiters set
        waiting.discard(fut)
        if waiting:
            return
        del self._futures[job_id]
        if registered:  # timed out or cancelled (not woken): leave the set, best effort
            done = self._batcher.execute("SREM", self._keys.waiters(job_id), self.inbox)
            done.add_done_callback(_ignore)

    def _wake(self, job_id: str) -> None:
        for fut in self._futures.pop(job_id, ()):
            if not fut.done():
                fut.set_result(None)

    async def _pop(self) -> list[Any]:
        """The ids in the inbox: the first waited for (``BLPOP``), the rest taken at once
        (``LPOP`` with a count). Plain single-key commands, so they run on a cluster too."""
        popped: Any = await self._client.blpop([self.inbox], timeout=LISTEN_BLOCK)
        if not popped:
            return []
        self._wake(as_text(popped[1]))
        more: Any = await self._client.lpop(self.inbox, POP_COUNT)
        return list(more or [])

    async def _listen(self) -> None:
        pause = BACKOFF_FIRST
        failed = False
        while self._futures:
            try:
                if failed:  # a reply lost with the connection may have carried some ids
                    for job_id in await self._ended(list(self._futures)):
                        self._wake(job_id)
                    failed = False
                ids = await self._pop()
                pause = BACKOFF_FIRST
            except Exception as exc:
                if not failed:
                    log.warning("waiting for job results on %s: %s; retrying", self.inbox, exc)
                failed = True
                await asyncio.sleep(pause)
                pause = min(pause * 2, BACKOFF_MAX)
                continue
            for job_id in ids:
                self._wake(as_text(job_id))

    async def _ended(self, job_ids: list[str]) -> list[str]:
        """Which of ``job_ids`` have ended or have no record (their waiters must look)."""
        states = await asyncio.gather(
            *(self._batcher.execute("HGET", self._keys.record(j), "state") for j in job_ids),
            return_exceptions=True,
        )
        return [
            j
            for j, state in zip(job_ids, states, strict=True)
            if not isinstance(state, Exception)
            and (state is None or as_text(state) in FINAL_STATES)
        ]

    async def close(self) -> None:
        """Stop the listener; waits still running fail with ``ConnectionError``."""
        task, self._listener = self._listener, None
        if task is not None and not task.done():
            await stop_task(task)
        futures, self._futures = self._futures, {}
        for waiting in futures.values():
            for fut in waiting:
                if not fut.done():
                    fut.set_exception(ConnectionError("the broker was closed"))
                    _ignore(fut)


def _ignore(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()  # retrieved: a failed best-effort SREM is not worth a warning
