"""Lease renewals over a slow link: they never queue behind other traffic, go out early
enough for the link's round trips, and say so (once) when the margin is thin.

1. Through a delaying TCP proxy (tests/_proxy.py: 200 ms each way to the server, and 5% of
   the chunks in either direction held 400 ms more, with what follows them on the same
   connection), a worker with ``lease_ttl=2`` runs 240 jobs of 1-2.5 s each, 60 at a time:
   no lease is lost and no job runs twice.
2. The batcher's priority lane: a command queued there goes out while a pipelined round trip
   of the main lane is in flight, and answers before it; one on the main lane waits.
3. ``RenewalTimes``: renewals move earlier as round trips grow, and the first renewal that
   took more than a third of its margin is reported once, with the numbers.
"""

from __future__ import annotations

import asyncio
import logging
import random
import urllib.parse
from collections import Counter
from collections.abc import Awaitable

import pytest
from _proxy import TcpProxy
from redis.asyncio import Redis

import aqw
from aqw._redis.batch import CommandBatcher
from aqw.lease._keeper import MARGIN_TIMEOUTS, RenewalTimes
from tests._helpers import REDIS_URL, eventually

JOBS = 120  # two rounds of CONCURRENCY: every slot renews over the stalling link
CONCURRENCY = 60
TTL = 2.0


@pytest.mark.redis
@pytest.mark.timeout(90)
async def test_no_lease_is_lost_over_a_slow_stalling_link(queue_name: str) -> None:
    server = urllib.parse.urlsplit(REDIS_URL)
    proxy = await TcpProxy(server.hostname or "127.0.0.1", server.port or 6379).start()
    proxy.latency, proxy.stalls, proxy.random = 0.2, (0.05, 0.4), random.Random(7)
    durations = random.Random(11)
    runs: Counter[str] = Counter()
    producer = aqw.App(REDIS_URL, queue=queue_name, lease_ttl=TTL)  # direct: enqueue fast
    app = aqw.App(proxy.url, queue=queue_name, lease_ttl=TTL)
    for each in (producer, app):

        @each.task(name="work")
        async def work(n: int, ctx: aqw.Context) -> None:
            runs[ctx.job_id] += 1
            await asyncio.sleep(durations.uniform(1.0, 2.5))  # two to four renewals

    try:
        ids = {str(i) for i in await producer.tasks["work"].enqueue_many(list(range(JOBS)))}
        worker = app.worker(concurrency=CONCURRENCY)
        async with worker:
            await eventually(lambda: worker.stats.processed >= JOBS, 60, "every job", interval=0.1)
    finally:
        await app.close()
        await producer.close()
        await proxy.aclose()
    assert proxy.stalled > 0  # the link did stall
    assert set(runs) == ids
    assert [n for n in runs.values() if n > 1] == []  # no job ran twice
    s = worker.stats
    assert (s.processed, s.lease_lost, s.failed) == (JOBS, 0, 0), s


@pytest.mark.redis
async def test_the_priority_lane_never_waits_behind_a_round_trip_in_flight(
    queue_name: str,
) -> None:
    client = Redis.from_url(REDIS_URL)
    batcher = CommandBatcher(client)
    key = f"aqw:{{{queue_name}}}:lane"
    done: list[str] = []

    async def note(name: str, fut: Awaitable[object]) -> None:
        await fut
        done.append(name)

    try:
        # a main-lane round trip that the server holds 0.5 s
        blocked = asyncio.ensure_future(note("main: BLPOP", batcher.execute("BLPOP", key, 0.5)))
        await asyncio.sleep(0.05)  # it is in flight
        queued = asyncio.ensure_future(note("main: PING", batcher.execute("PING")))
        await note("priority: PING", batcher.priority.execute("PING"))
        await asyncio.gather(blocked, queued)
    finally:
        await client.aclose()
    assert done == ["priority: PING", "main: BLPOP", "main: PING"]


def test_renewals_move_earlier_as_round_trips_grow() -> None:
    times = RenewalTimes()
    assert times.renew_after(TTL, TTL / 3) == TTL / 3  # nothing measured: every ttl/3
    for _ in range(20):
        times.took(0.01)  # a fast link: the schedule stays
    assert times.renew_after(TTL, TTL / 3) == TTL / 3
    for _ in range(20):
        times.took(0.6)  # a slow one: two timeouts must fit before the expiry
    after = times.renew_after(TTL, TTL / 3)
    assert after < TTL / 3
    assert TTL - after >= MARGIN_TIMEOUTS * times.timeout or after == TTL / 10
    for _ in range(20):
        times.took(5.0)  # hopeless: never sooner than a tenth of the TTL
    assert times.renew_after(TTL, TTL / 3) == TTL / 10


def test_a_renewal_slow_for_its_margin_is_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    times = RenewalTimes()
    with caplog.at_level(logging.WARNING, logger="aqw.lease"):
        times.took(0.2, 1.0, "aqw:{q}:lease:a", TTL)  # a fifth of its margin: fine
        assert caplog.records == []
        times.took(0.5, 1.2, "aqw:{q}:lease:b", TTL)  # over a third
        times.took(0.9, 1.2, "aqw:{q}:lease:c", TTL)  # again: not reported again
    [record] = caplog.records
    message = record.getMessage()
    assert "aqw:{q}:lease:b" in message and "500 ms of the 1200 ms" in message, message
    assert "ttl 2.0 s" in message and "lease_ttl" in message
