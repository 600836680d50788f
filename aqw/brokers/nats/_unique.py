"""Enqueue with an idempotency key on NATS (``UniqueEnqueue``): claim the key in
``AQW_q_KEYS`` (pending, with the job), publish the job under ``Nats-Msg-Id`` = its id,
confirm the claim (``_keys.py`` has the claim's life). A pending claim found by a later
enqueue (its producer died before confirming) gets its own job published again: the stream
drops that publish as a duplicate when the first one went out."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

from nats.js import JetStreamContext

from ...job import Job
from ._delayed import Delayed
from ._keys import Keys, Stuck
from ._layout import DUPLICATE_WINDOW, Layout
from ._records import KvJobRecords

#: Seconds short of the duplicate window past which a pending claim is not published again.
WINDOW_MARGIN = 5.0


class UniqueEnqueue:
    """``publish``: one queue's enqueue with an idempotency key (module docstring)."""

    def __init__(
        self,
        keys: Keys,
        records: KvJobRecords,
        js: JetStreamContext,
        names: Layout,
        delayed: Delayed,
        announce: Callable[[Sequence[Job]], Awaitable[None]],
    ) -> None:
        self._keys, self._records, self._js = keys, records, js
        self._names, self._delayed, self._announce = names, delayed, announce

    async def publish(self, job: Job, ttl: float, run_at: float | None) -> tuple[str, bool]:
        """(the id holding the key, True when ``job`` was a duplicate)."""
        assert job.key is not None
        keys = self._keys
        holder, pending = await keys.claim(job.key, job.id, job.encode(), run_at, ttl)
        if isinstance(pending, Stuck):
            if await self._unstick(pending):
                await keys.confirm(job.key, pending)
            return holder, True
        if pending is None:
            return holder, True
        await self._publish_once(job, run_at)
        await keys.confirm(job.key, pending)
        return job.id, False

    async def _publish_once(self, job: Job, run_at: float | None, record: bool = True) -> None:
        """``job`` published (or scheduled) under ``Nats-Msg-Id`` = its id, with its record
        written first unless ``record`` is False."""
        await self._announce([job])
        due = run_at if run_at is not None and run_at > time.time() else None
        if record:
            await self._records.enqueued(job, due)
        if due is not None:
            await self._delayed.add([job.encode()], due, job.id)
            return
        names = self._names
        headers = {"Nats-Msg-Id": job.id}
        subject = names.subject_for(job.priority)
        await self._js.publish(subject, job.encode(), stream=names.stream, headers=headers)

    async def _unstick(self, stuck: Stuck) -> bool:
        """Publish the job of another enqueue's pending claim again; True when it is
        published now (or was: its record moved on). Within the streams' duplicate window a
        publish that did go out drops this one; past it, a record still waiting cannot say
        whether the job went out, and nothing is sent (the claim stays pending)."""
        fields = await self._records.fields(stuck.job_id)
        state = None if fields is None else fields.get("state")
        if state not in (None, "queued", "delayed"):
            return True  # it was published and has moved on since
        if state is not None and stuck.age >= DUPLICATE_WINDOW - WINDOW_MARGIN:
            return False
        # A record still waiting is left as it is: the job may be starting meanwhile.
        await self._publish_once(Job.decode(stuck.data), stuck.run_at, record=state is None)
        return True
