"""The records of idempotency keys in Redis (``records=redis://...``), with the key names of
the Redis broker: ``aqw:{queue}:key:<key>`` (the enqueue record: a pending claim, then the
job's id for the idempotency TTL) and ``aqw:{queue}:done:<key>`` (the completion record).
Both share the ``{queue}`` hash tag, so each script touches one slot."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from ..._redis import scripts
from ..._redis.client import UNREACHABLE, Redis, make_client
from ..._redis.keys import QueueKeys
from ..._redis.scripts import Script, ms
from ..messages import ScheduleMark
from ._errors import RecordsUnavailable

T = TypeVar("T")

#: What means "the store is unreachable": the client's errors, and the system's.
DOWN: tuple[type[Exception], ...] = (*UNREACHABLE, OSError)

#: KEYS[1] enqueue record, KEYS[2] completion record; ARGV[1] job id, ARGV[2] ttl in ms.
#: {holder, 1} when the key is taken (nothing written), else {job id, 0}.
_CLAIM = Script(
    "sqs_key_claim",
    """
local existing = redis.call('GET', KEYS[1])
if existing then
  return {existing, 1}
end
local done = redis.call('GET', KEYS[2])
if done then
  return {done, 1}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {ARGV[1], 0}
""",
)

#: Same keys and arguments: extend the claim of ARGV[1] (or take the key again when its claim
#: lapsed and no other job holds it). 1 when kept, 0 when another job holds the key.
_CONFIRM = Script(
    "sqs_key_confirm",
    """
local cur = redis.call('GET', KEYS[1])
if cur ~= ARGV[1] then
  if cur then
    return 0
  end
  local done = redis.call('GET', KEYS[2])
  if done and done ~= ARGV[1] then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
""",
)

#: KEYS[1] enqueue record; ARGV[1] job id: delete the record if it is still that job's.
_RELEASE = Script(
    "sqs_key_release",
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
""",
)


class RedisKeyStore:
    """``KeyStore`` on a Redis server (the client is made on first use)."""

    def __init__(self, url: str, client: Redis | None = None) -> None:
        self.url = url
        self._client = client
        self._owns = client is None

    @property
    def client(self) -> Redis:
        if self._client is None:
            self._client = make_client(self.url, socket_timeout=5.0)
        return self._client

    @contextlib.contextmanager
    def _reaching(self) -> Iterator[None]:
        try:
            yield
        except DOWN as exc:
            raise RecordsUnavailable(f"records= store (Redis) unreachable: {exc}") from exc

    async def _run(self, call: Callable[[], Awaitable[T]]) -> T:
        with self._reaching():
            return await call()

    async def claim(self, queue: str, key: str, job_id: str, ttl: float) -> str | None:
        keys = QueueKeys(queue)
        args: list[Any] = [job_id, ms(ttl)]
        holder, taken = await self._run(
            lambda: _CLAIM(self.client, [keys.idempotency(key), keys.done(key)], args)
        )
        if not taken:
            return None
        return holder.decode() if isinstance(holder, bytes) else str(holder)

    async def confirm(self, queue: str, key: str, job_id: str, ttl: float) -> bool:
        keys = QueueKeys(queue)
        args: list[Any] = [job_id, ms(ttl)]
        kept = await self._run(
            lambda: _CONFIRM(self.client, [keys.idempotency(key), keys.done(key)], args)
        )
        return bool(kept)

    async def release(self, queue: str, key: str, job_id: str) -> None:
        record = QueueKeys(queue).idempotency(key)
        await self._run(lambda: _RELEASE(self.client, [record], [job_id]))

    async def complete(self, queue: str, key: str, job_id: str, ttl: float) -> None:
        record = QueueKeys(queue).done(key)
        await self._run(lambda: self.client.set(record, job_id, px=ms(ttl)))

    async def is_completed(self, queue: str, key: str) -> bool:
        record = QueueKeys(queue).done(key)
        return bool(await self._run(lambda: self.client.exists(record)))

    # -- schedule marks (``MarkStore``): the Redis broker's hash and script ---------------------

    async def read_marks(self, queue: str) -> dict[str, ScheduleMark]:
        raw: Any = await self._run(lambda: self.client.hgetall(QueueKeys(queue).schedule))
        out: dict[str, ScheduleMark] = {}
        for task, value in raw.items():
            text = value.decode() if isinstance(value, bytes) else str(value)
            mark = ScheduleMark.decode(text)
            if mark is not None:
                out[task.decode() if isinstance(task, bytes) else str(task)] = mark
        return out

    async def advance_mark(self, queue: str, task: str, mark: ScheduleMark) -> None:
        key, argv = QueueKeys(queue).schedule, [task, repr(mark.tick), mark.encode()]
        await self._run(lambda: scripts.load("schedule_mark")(self.client, [key], argv))

    async def close(self) -> None:
        if self._owns and self._client is not None:
            client, self._client = self._client, None
            await client.aclose()
