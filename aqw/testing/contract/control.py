"""The contracts of the operator's parts (``aqw.brokers.parts``): ``broker.control`` (pause,
the waiting list, delete, promote, find) and ``broker.rates`` (counts and durations by minute
and hour). A broker without the part is skipped, saying so."""

from __future__ import annotations

import time

import pytest

from ...brokers.tallies import TaskTally, duration_bucket
from ...job import Job
from ._kit import ContractBase, Kit, fetch_one, job, sees_the_same


class ControlContract(ContractBase):
    """``broker.control``: what ``aqw queue`` and the dashboard do to a queue."""

    async def test_pause_and_resume_say_whether_they_changed_anything(self, kit: Kit) -> None:
        control = kit.broker.control
        if control is None:
            pytest.skip(f"the {kit.broker.system} broker cannot pause a queue")
        assert isinstance(control.shared, bool)
        assert not await control.paused()
        assert await control.pause() and not await control.pause()
        other = await kit.consumer("c2")
        if sees_the_same(kit, control.shared) and other.control is not None:
            assert await other.control.paused()
        assert await control.resume() and not await control.resume()
        assert not await control.paused()

    async def test_the_waiting_list_pages_and_a_waiting_job_is_deleted(self, kit: Kit) -> None:
        b = kit.broker
        control = b.control
        if control is None:
            pytest.skip(f"the {b.system} broker has no waiting list")
        jobs = [job(80 + i) for i in range(4)]
        await b.publish(jobs)
        assert (await control.waiting_counts())[0] == 4
        first = await control.waiting_page(0, None, 3)
        rest = await control.waiting_page(0, first[-1].entry_id, 3)
        # every job once (oldest first; a partitioned queue: partition by partition)
        assert len(first) == 3 and len(rest) == 1
        assert sorted(w.data for w in first + rest) == sorted(j.encode() for j in jobs)
        if not kit.broker.routes_jobs:
            assert [w.data for w in first] == [j.encode() for j in jobs[:3]]
        gone = Job.decode(first[1].data)
        assert await control.find(gone.id) == first[1].data
        assert await control.delete_waiting(0, first[1].entry_id)
        assert not await control.delete_waiting(0, first[1].entry_id)
        assert await control.find(gone.id) is None
        [got] = await b.fetch(1, kit.traits.block)  # taken: no longer waiting, not deleted
        assert not await control.delete_waiting(0, got.id)
        assert await control.find(Job.decode(got.data).id) == got.data  # running: found
        assert (await control.waiting_counts())[0] == 2

    async def test_promote_makes_a_delayed_job_due(self, kit: Kit) -> None:
        b = kit.broker
        control = b.control
        if control is None:
            pytest.skip(f"the {b.system} broker cannot promote a delayed job")
        later, other = job(90), job(91)
        await b.schedule([later, other], time.time() + 3600)
        assert await control.find(later.id) == later.encode()
        assert not await control.promote("no-such-job")
        assert await control.promote(later.id)
        await b.promote_due()
        got = await fetch_one(kit, b)
        assert got.data == later.encode()
        assert (await b.depth()).delayed == 1


class RatesContract(ContractBase):
    """``broker.rates``: counts and duration histograms added by minute, read back by
    minute and by hour."""

    async def test_added_counts_are_summed_by_minute_and_hour(self, kit: Kit) -> None:
        rates = kit.broker.rates
        if rates is None:
            pytest.skip(f"the {kit.broker.system} broker keeps no rates")
        assert isinstance(rates.shared, bool)
        now = time.time()
        minute = now - now % 60
        fast = duration_bucket(0.002)
        await rates.add({minute: {"t": TaskTally({"processed": 2}, {fast: 2})}})
        await rates.add({minute: {"t": TaskTally({"failed": 1}), "u": TaskTally({"dead": 1})}})
        [(start, tasks)] = (await rates.read(minute, False)).items()
        assert start == minute
        assert tasks["t"].counts == {"processed": 2, "failed": 1}
        assert tasks["t"].durations == {fast: 2}
        assert tasks["u"].counts == {"dead": 1}
        hours = await rates.read(now - 3600, True)
        assert sum(t["t"].counts.get("processed", 0) for t in hours.values()) == 2
        assert await rates.read(now + 120, False) == {}
        other = await kit.consumer("c2")
        if sees_the_same(kit, rates.shared) and other.rates is not None:
            assert (await other.rates.read(minute, False))[minute]["t"].counts["processed"] == 2
