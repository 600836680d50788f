"""Job records on SQS (``StoreJobRecords``): kept in the process, as SQS has no place for
them, and with a ``records=redis://`` store the **final** records of the jobs whose results
someone reads elsewhere written there too: those of the tasks that keep results
(``keep_result=True``, told by the worker at its start) and every batch child or flow step.
That is what ``keep_result``, ``app.result`` from another process and flows with edges need
(a step's input is its parents' results, read by the count's step in the store).

The final record is written by the settle, after the key's completion record and before the
batch count and SQS's delete: a worker killed in between leaves a message that is received
again and writes the record again (the same end, or the later attempt's). The key is the
Redis broker's job record, ``aqw:{q}:job:<id>`` (the count's step writes the result into
that same hash), kept ``keep_for`` seconds.

Reading: the local record when it has ended (the job ran here), else the store's. Waiting
for a job's end polls the store (from 10 ms to 0.5 s apart) while the local record has not
ended: SQS has nothing to wake a waiter in another process. A job unknown to both is
``UnknownJob``. Running states, cancels and progress stay per process.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Collection, Mapping
from typing import Any

from ..._redis.client import Redis
from ..._redis.scripts import ms
from ...errors import UnknownJob
from ...job import Job
from ...record import FINAL_STATES, JobInfo
from ..batching import BATCH_HEADER
from ..local import LocalJobRecords
from ..local.clock import clock
from ._errors import RecordsUnavailable
from ._keys_redis import DOWN

#: Seconds between two reads of the store by a waiter: the first, and the longest.
POLL_FIRST, POLL_MOST = 0.01, 0.5


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class StoreJobRecords(LocalJobRecords):
    """``SQSBroker.records``: ``LocalJobRecords``, and with ``client`` (the ``records=redis://``
    store's) the final records of the jobs ``wants`` names written there too."""

    def __init__(self, queue: str, client: Callable[[], Redis] | None = None) -> None:
        super().__init__(queue)
        self._client = client
        self.prefix = f"aqw:{{{queue}}}:job:"
        #: The tasks whose results are kept (the worker tells them at its start).
        self._kept: frozenset[str] = frozenset()

    @property
    def results_shared(self) -> bool:
        """True with a store: a final record written there is read by every process."""
        return self._client is not None

    def keep_results_of(self, tasks: Collection[str]) -> None:
        self._kept = frozenset(tasks)

    def wants(self, job: Job | None) -> bool:
        """True when ``job``'s final record goes to the store: its task keeps results, or it
        is a batch child or a flow step. A plain job pays nothing."""
        if job is None or self._client is None:
            return False
        return job.task in self._kept or BATCH_HEADER in job.headers

    async def put_final(self, job: Job, state: str, fields: Mapping[str, str], keep: float) -> None:
        """Write ``job``'s final record (its record here, ``fields`` over it) to the store for
        ``keep`` seconds, in one step. Unreachable: ``RecordsUnavailable`` (the settle stops:
        its message is not deleted and comes back)."""
        assert self._client is not None
        record: dict[Any, Any] = dict(self._get(job.id) or {"task": job.task})
        record.setdefault("task", job.task)
        record.setdefault("enqueued_at", repr(job.enqueued_at))
        record.update(fields)
        record["state"] = state
        key = self.prefix + job.id
        try:
            async with self._client().pipeline(transaction=True) as pipe:
                pipe.delete(key)
                pipe.hset(key, mapping=record)
                pipe.pexpire(key, ms(max(keep, 1.0)))
                await pipe.execute()
        except DOWN as exc:
            raise RecordsUnavailable(f"records= store (Redis) unreachable: {exc}") from exc

    async def _stored(self, job_id: str) -> JobInfo | None:
        """The store's final record of ``job_id``, or None."""
        if self._client is None:
            return None
        try:
            raw = await self._client().hgetall(self.prefix + job_id)
        except DOWN as exc:
            raise RecordsUnavailable(f"records= store (Redis) unreachable: {exc}") from exc
        fields = {_text(k): _text(v) for k, v in raw.items()}
        if fields.get("state") not in FINAL_STATES:  # none, or only a count's result
            return None
        return JobInfo.from_fields(job_id, self.queue, fields)

    async def record(self, job_id: str) -> JobInfo | None:
        local = self.info(job_id)
        if local is not None and local.finished:
            return local
        stored = await self._stored(job_id)
        return stored if stored is not None else local

    async def wait_finished(self, job_id: str, timeout: float | None) -> JobInfo:
        if self._client is None:
            return await super().wait_finished(job_id, timeout)
        deadline = math.inf if timeout is None else clock.monotonic() + timeout
        pause = POLL_FIRST
        while True:
            info = await self.record(job_id)
            if info is None:
                raise UnknownJob(job_id, self.queue)
            if info.finished:
                return info
            left = deadline - clock.monotonic()
            if left <= 0:
                raise TimeoutError(f"job {job_id!r} has not ended within {timeout}s")
            try:  # woken at once when it ends here; else the store is read again
                return await super().wait_finished(job_id, min(pause, left))
            except TimeoutError:
                pass
            except UnknownJob:  # its local record went: the store may still have it
                await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, POLL_MOST)
