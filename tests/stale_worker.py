"""A worker process for tests/test_stale_start.py: ``python tests/stale_worker.py QUEUE
CONCURRENCY PREFETCH``.

Runs four tasks on the real Redis (AQW_TEST_REDIS_URL) until SIGTERM, all with a 1 s lease:
``plain``, ``limited`` (``rate_limit``), ``capped`` (``max_per_key=1`` over a few keys) and
``debounced`` (enqueued with ``debounce=``). Each handler notes its start, works a few ms, then
writes its effect, both into a ledger under the queue's hash tag (removed with the queue):

- a start after the job's end is counted (``starts_after_end``): its record already holds
  ``finished_at`` (a settle wrote it) and names this run's fencing token (the start itself
  rewrote the ended record). An earlier holder that resumes late, after a freeze, finds
  another run's token there (``late_resumes``: fencing keeps its writes out);
- the effects are fenced, as a datastore does it: an effect whose token is not above the last
  accepted one is refused (``refused_effects``); an accepted one is added to the job's entry
  of the effects hash; a second accepted effect is counted (``second_effects``: a holder
  frozen between its effect and its settle, at least once), and an accepted effect written
  after the job's end (``effects_after_end``). Each counted case is also listed (``late``).
"""

from __future__ import annotations

import asyncio
import random
import sys
from typing import Any

from _worker_script import REDIS_URL, run, serve
from redis.asyncio import Redis

import aqw
from aqw.brokers.redis import RedisBroker

LEASE_TTL = 1.0
RATE = "150/s"
CAP_KEYS = 6

#: KEYS[1] the job's record, KEYS[2] the counters hash, KEYS[3] the list of cases.
#: ARGV[1] job id, ARGV[2] task, ARGV[3] fencing token.
START = """
local rec = redis.call('HMGET', KEYS[1], 'finished_at', 'fencing_token')
if rec[1] then
  local case = tonumber(rec[2]) == tonumber(ARGV[3]) and 'starts_after_end' or 'late_resumes'
  redis.call('HINCRBY', KEYS[2], case, 1)
  redis.call('RPUSH', KEYS[3], case .. ' ' .. table.concat(ARGV, ' ') .. ' ' ..
    cjson.encode(redis.call('HGETALL', KEYS[1])))
end
return 1
"""

#: KEYS[1] the job's record, KEYS[2] the counters hash, KEYS[3] the list of cases, KEYS[4] the
#: effects hash (job id -> its accepted effects' fencing tokens, comma-separated).
#: ARGV[1] job id, ARGV[2] task, ARGV[3] fencing token. Returns 1 when accepted.
EFFECT = """
local prev = redis.call('HGET', KEYS[4], ARGV[1])
local last = prev and tonumber(string.match(prev, '(%d+)$')) or 0
if tonumber(ARGV[3]) <= last then
  redis.call('HINCRBY', KEYS[2], 'refused_effects', 1)
  return 0
end
if prev then
  redis.call('HINCRBY', KEYS[2], 'second_effects', 1)
end
if redis.call('HEXISTS', KEYS[1], 'finished_at') == 1 then
  redis.call('HINCRBY', KEYS[2], 'effects_after_end', 1)
  redis.call('RPUSH', KEYS[3], 'effect_after_end ' .. table.concat(ARGV, ' ') .. ' ' ..
    cjson.encode(redis.call('HGETALL', KEYS[1])))
end
redis.call('HSET', KEYS[4], ARGV[1], prev and (prev .. ',' .. ARGV[3]) or ARGV[3])
return 1
"""


def ledger_keys(queue: str) -> tuple[str, str, str]:
    """(the counters hash, the effects hash, the list of counted cases), under the queue's
    hash tag."""
    tag = f"aqw:{{{queue}}}"
    return f"{tag}:ledger:counters", f"{tag}:ledger:effects", f"{tag}:ledger:late"


def make_app(queue: str, ledger: Redis | None = None) -> aqw.App:
    """The app of the four tasks; with ``ledger``, one that runs them."""
    app = aqw.App(REDIS_URL, queue=queue, lease_ttl=LEASE_TTL)
    broker = app.broker
    assert isinstance(broker, RedisBroker)
    counters, effects, late = ledger_keys(queue)
    start = ledger.register_script(START) if ledger is not None else None
    effect = ledger.register_script(EFFECT) if ledger is not None else None

    async def work(ctx: aqw.Context, seconds: float) -> None:
        assert start is not None and effect is not None, "this app only enqueues"
        record = broker.keys.record(ctx.job_id)
        args = [ctx.job_id, ctx.job.task, ctx.fencing_token]
        await start(keys=[record, counters, late], args=args)
        await asyncio.sleep(seconds)
        await effect(keys=[record, counters, late, effects], args=args)

    @app.task(name="plain")
    async def plain(n: int, ctx: aqw.Context) -> None:
        await work(ctx, random.uniform(0.005, 0.02))

    @app.task(name="limited", rate_limit=RATE)
    async def limited(n: int, ctx: aqw.Context) -> None:
        await work(ctx, 0.002)

    @app.task(name="capped", concurrency_key=lambda p: p["k"], max_per_key=1)
    async def capped(p: dict[str, Any], ctx: aqw.Context) -> None:
        await work(ctx, 0.01)

    @app.task(name="debounced")
    async def debounced(n: int, ctx: aqw.Context) -> None:
        await work(ctx, 0.005)

    return app


async def main(queue: str, concurrency: int, prefetch: int) -> None:
    ledger = Redis.from_url(REDIS_URL)
    app = make_app(queue, ledger)
    await serve(app, ledger, concurrency=concurrency, grace=2.0, prefetch=prefetch)


if __name__ == "__main__":
    run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
