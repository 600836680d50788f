"""Debounced enqueue on Redis (``RedisDebounce``, a shared ``Debounce`` part): one call of
``debounce.lua``, which replaces the key's waiting job or schedules a new one, and writes
the job's record, atomically. The key's state is the hash ``aqw:{q}:debounce:<key>``."""

from __future__ import annotations

import json
import time
from typing import Any

from ..._redis import scripts
from ..._redis.batch import CommandBatcher
from ..._redis.keys import QueueKeys
from ..._redis.scripts import ms
from ...flow import DEBOUNCE_SLACK
from ...job import Job
from ...record import UNFINISHED_KEEP, stamp
from ._priorities import RedisLevels


def split_at_id(job: Job) -> tuple[bytes, bytes]:
    """``job``'s wire form cut around its id: (the part before, the part after), so the
    script can write it under the id of the job it replaces."""
    data = job.encode()
    head = b'{"v":1,"id":' + json.dumps(job.id).encode()
    if not data.startswith(head):  # the envelope opens with its version and id
        raise ValueError(f"unexpected job envelope for {job.id!r}")
    start = len(head) - len(job.id) - 1  # the id's first character (inside the quotes)
    return data[:start], data[start + len(job.id) :]


class RedisDebounce:
    """Debounced enqueue on one queue (``RedisBroker.debounce``), shared by every process."""

    shared = True

    def __init__(self, batcher: CommandBatcher, keys: QueueKeys, levels: RedisLevels) -> None:
        self._batcher = batcher
        self._keys = keys
        self._levels = levels
        self._script = scripts.load("debounce")

    async def publish(
        self, job: Job, debounce: float, debounce_max: float | None
    ) -> tuple[str, bool]:
        """One ``debounce.lua`` call: (the waiting job's id, True when it replaced one),
        announcing the job's priority level in the same round trip when it is new here."""
        return await self._levels.around([job], self._publish(job, debounce, debounce_max))

    async def _publish(
        self, job: Job, debounce: float, debounce_max: float | None
    ) -> tuple[str, bool]:
        assert job.key is not None
        keys = self._keys
        before, after = split_at_id(job)
        reply: Any = await self._batcher.script(
            self._script,
            [keys.debounce(job.key), keys.delayed_for(job.priority)],
            [
                keys.tag + ":",
                int(time.time() * 1000),
                ms(debounce),
                ms(debounce_max) if debounce_max is not None else 0,
                ms(DEBOUNCE_SLACK),
                ms(UNFINISHED_KEEP),
                job.id,
                before,
                after,
                job.task,
                repr(job.enqueued_at),
                stamp(job.expires_at),
                job.key,
            ],
        )
        job_id, replaced = reply
        return job_id.decode() if isinstance(job_id, bytes) else str(job_id), bool(replaced)
