"""The schedule marks of a queue's periodic tasks on Redis (``Broker.schedule_marks``): one
hash, ``aqw:{q}:schedule``, task -> ``"<tick> <job id>"``, shared by every process, so a new
scheduler leader resumes where the last one stopped. A mark only moves forward."""

from __future__ import annotations

from redis.asyncio import Redis

from ..._redis.keys import QueueKeys
from ..._redis.scripts import Script
from ..local.marks import ScheduleMark
from ._entries import text

#: KEYS[1] the marks hash; ARGV[1] task, ARGV[2] tick, ARGV[3] the encoded mark. Writes the
#: mark unless a later tick is recorded; 1 when written.
SET_MARK = Script(
    "schedule_mark",
    """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current then
  local tick = tonumber(string.match(current, '^%S+'))
  if tick and tick > tonumber(ARGV[2]) then
    return 0
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
""",
)


class RedisSchedule:
    """Read and move the schedule marks of one queue."""

    __slots__ = ("_client", "_key")

    def __init__(self, client: Redis, keys: QueueKeys) -> None:
        self._client = client
        self._key = keys.schedule

    async def marks(self) -> dict[str, ScheduleMark]:
        raw = await self._client.hgetall(self._key)
        out: dict[str, ScheduleMark] = {}
        for task, value in raw.items():
            mark = ScheduleMark.decode(text(value))
            if mark is not None:
                out[text(task)] = mark
        return out

    async def set_mark(self, task: str, mark: ScheduleMark) -> None:
        await SET_MARK(self._client, [self._key], [task, repr(mark.tick), mark.encode()])
