"""The contracts of the smaller parts (``aqw.brokers.parts``): worker status, schedule
marks, depth history, debounce and flow limits. Each runs on a broker that has the part
(a broker without one is skipped, saying so), and checks what ``shared`` promises: another
broker of the queue sees the same state when the part is shared, or when the whole queue
lives in this process (``Broker.in_process``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from ...brokers.messages import DEPTH_BUCKET, ScheduleMark, bucket_of
from ...errors import RateLimited
from ...flow import DEBOUNCE_HEADER, Limits, Rate
from ._kit import ContractBase, Kit, decoded, fetch_one, job, rec, sees_the_same

#: The short-lived heartbeat's TTL in seconds.
SHORT_TTL = 2.0


class StatusContract(ContractBase):
    """``broker.status``: the workers' heartbeats."""

    async def test_heartbeats_round_trip_expire_and_withdraw(self, kit: Kit) -> None:
        status = kit.broker.status
        assert isinstance(status.shared, bool)

        def beat(worker: str) -> dict[str, Any]:
            return {
                "worker": worker,
                "queue": kit.queue,
                "state": "running",
                "pid": 4242,
                "concurrency": 8,
                "in_flight": 1,
                "at": 1_700_000_000.5,
            }

        # The other consumer first: opening it can take longer than a short heartbeat lives
        # on a loaded machine. The short one lives long enough for the reads below, then
        # must be gone by itself.
        other = await kit.consumer("c2")
        await status.publish_heartbeat("w-short", beat("w-short"), SHORT_TTL)
        await status.publish_heartbeat("w-long", beat("w-long"), 60)
        await status.publish_heartbeat("w-gone", beat("w-gone"), 60)

        async def by_worker() -> dict[str, dict[str, Any]]:
            return {h["worker"]: h for h in await status.heartbeats()}

        assert await by_worker() == {w: beat(w) for w in ("w-short", "w-long", "w-gone")}
        await status.remove_heartbeat("w-gone")
        assert set(await by_worker()) == {"w-short", "w-long"}
        seen = {h["worker"] for h in await other.status.heartbeats()}
        assert seen == ({"w-short", "w-long"} if sees_the_same(kit, status.shared) else set())
        deadline = time.monotonic() + SHORT_TTL + 10
        while (now := await by_worker()) != {"w-long": beat("w-long")}:
            assert set(now) == {"w-short", "w-long"}, now
            assert time.monotonic() < deadline, f"the {SHORT_TTL} s heartbeat never expired"
            await asyncio.sleep(0.1)


class MarksContract(ContractBase):
    """``broker.marks``: the periodic tasks' last ticks, only ever moved forward."""

    async def test_marks_move_only_forward(self, kit: Kit) -> None:
        marks = kit.broker.marks
        assert isinstance(marks.shared, bool)
        assert await marks.read() == {}
        await marks.advance("hourly", ScheduleMark(3600.0, "job-1"))
        await marks.advance("daily", ScheduleMark(86400.0))
        assert await marks.read() == {
            "hourly": ScheduleMark(3600.0, "job-1"),
            "daily": ScheduleMark(86400.0, ""),
        }
        await marks.advance("hourly", ScheduleMark(0.0, "job-0"))  # a paused ex-leader
        assert (await marks.read())["hourly"] == ScheduleMark(3600.0, "job-1")
        await marks.advance("hourly", ScheduleMark(7200.0, "job-2"))
        other = await kit.consumer("c2")
        if sees_the_same(kit, marks.shared):
            assert (await other.marks.read())["hourly"] == ScheduleMark(7200.0, "job-2")
        else:
            assert await other.marks.read() == {}


class HistoryContract(ContractBase):
    """``broker.history``: one depth sample per bucket, and the delayed page."""

    async def test_one_sample_per_bucket_with_the_depth(self, kit: Kit) -> None:
        b = kit.broker
        history = b.history
        if history is None:
            pytest.skip(f"the {b.system} broker keeps no depth history")
        assert isinstance(history.shared, bool)
        await b.publish([job(50), job(51)])
        now = float(bucket_of(time.time()))
        await history.sample(now + 1)
        await b.publish([job(52)])
        await history.sample(now + 2)  # the same bucket: still the first sample
        [sample] = await history.since(now - 1)
        assert (sample.at, sample.waiting, sample.in_flight, sample.dead) == (now, 2, 0, 0)
        await history.sample(now + DEPTH_BUCKET)
        assert [s.waiting for s in await history.since(now - 1)] == [2, 3]
        assert [s.waiting for s in await history.since(now + DEPTH_BUCKET)] == [3]
        other = await kit.consumer("c2")
        if sees_the_same(kit, history.shared) and other.history is not None:
            assert len(await other.history.since(now - 1)) == 2

    async def test_the_delayed_page_soonest_first(self, kit: Kit) -> None:
        b = kit.broker
        history = b.history
        if history is None:
            pytest.skip(f"the {b.system} broker keeps no delayed page")
        base = time.time() + 600
        jobs = [job(60 + i) for i in range(5)]
        for i, sent in enumerate(reversed(jobs)):  # the last due is scheduled first
            await b.schedule([sent], base + 10 * (len(jobs) - 1 - i))
        page = await history.delayed_page(0, 3)
        assert [p.data for p in page] == [j.encode() for j in jobs[:3]]
        assert [p.due for p in page] == pytest.approx([base, base + 10, base + 20], abs=0.01)
        rest = await history.delayed_page(3, 10)
        assert [p.data for p in rest] == [j.encode() for j in jobs[3:]]


class DebounceContract(ContractBase):
    """``broker.debounce``: a burst of enqueues of one key runs one job, the last payload."""

    async def test_a_burst_of_one_key_runs_one_job_with_the_last_payload(self, kit: Kit) -> None:
        b = kit.broker
        debounce = b.debounce
        if debounce is None:
            pytest.skip(f"the {b.system} broker cannot debounce (a sent job cannot change)")
        assert isinstance(debounce.shared, bool)
        wait = kit.traits.delay

        def burst(n: int) -> Any:
            return job(n, key="user-7", headers={DEBOUNCE_HEADER: "1"})

        first = burst(70)
        assert await debounce.publish(first, wait, None) == (first.id, False)
        assert (await rec(b, first.id)).state == "delayed"
        last = burst(71)
        assert await debounce.publish(last, wait, None) == (first.id, True)
        d = await fetch_one(kit, b, within=6)
        got = decoded(d)
        assert (got.id, got.payload) == (first.id, {"n": 71})  # the first id, the last payload
        assert await b.ack(d, got, None) is True
        await b.promote_due()
        assert await b.fetch(10, 0) == []
        after = burst(72)  # the key's job has run: a new enqueue makes a new job
        assert await debounce.publish(after, wait, None) == (after.id, False)


class LimitsContract(ContractBase):
    """``broker.flow_limits``: the start step under a rate limit and a per-key cap."""

    async def test_the_start_step_enforces_a_rate_and_a_cap(self, kit: Kit) -> None:
        b = kit.broker
        limits = b.flow_limits
        if limits is None:
            pytest.skip(f"the {b.system} broker enforces no rate limits or caps")
        assert isinstance(limits.shared, bool) and limits.options
        # Jobs under one limit share a route (a broker that routes jobs keeps them together).
        rate = Rate(1, 60.0)  # one start a minute: the second is refused
        bucket = Limits("bucket", rate.interval_us, rate.tolerance_us)
        one, two = (job(n, id=b.job_id_for("task:work")) for n in (80, 81))
        await b.publish([one, two])
        assert await b.job_lease_backend(one, bucket).acquire(b.job_lease_key(one), "a", 5000)
        with pytest.raises(RateLimited) as refused:
            await b.job_lease_backend(two, bucket).acquire(b.job_lease_key(two), "b", 5000)
        assert refused.value.retry_after > 0 and refused.value.reason == "rate_limit"
        assert await b.lease_backend().renew(b.job_lease_key(two), "b", 5000) is False

        cap = Limits(caps=(("tenant:1", 1),))
        three, four = (job(n, id=b.job_id_for("cap:work:tenant:1")) for n in (82, 83))
        await b.publish([three, four])
        key3 = b.job_lease_key(three)
        assert await b.job_lease_backend(three, cap).acquire(key3, "c", 5000)
        with pytest.raises(RateLimited) as capped:
            await b.job_lease_backend(four, cap).acquire(b.job_lease_key(four), "d", 5000)
        assert capped.value.reason == "concurrency"
        assert await b.lease_backend().release(key3, "c") is True  # its slot frees
        assert await b.job_lease_backend(four, cap).acquire(b.job_lease_key(four), "d", 5000)
