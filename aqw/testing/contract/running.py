"""The running jobs' states (``JobRecords.running_state(s)``, ``set_running_state``): read
from the records while they say running, written under the job's fencing token only, and
kept for a job whose worker died until it is settled or taken over."""

from __future__ import annotations

import asyncio
import time

import pytest

from ...brokers.base import Broker
from ...brokers.messages import Finish
from ...lease import Lease
from ._kit import ContractBase, Kit, decoded, fetch_n, fetch_one, job, rec, sees_the_same, start

#: The keys of a running-job state (``RunningJob.state``, aqw/worker/_running.py).
STATE_KEYS = {
    "state",
    "job_id",
    "task",
    "attempt",
    "worker",
    "started_at",
    "lease_expires_at",
    "fencing_token",
    "progress",
    "message",
}


def running(b: Broker, job_id: str, lease: Lease, **changes: str) -> dict[str, str]:
    """A running-job state of ``job_id`` under ``lease``, as a worker publishes it."""
    state = {
        "state": "running",
        "job_id": job_id,
        "task": "work",
        "attempt": "1",
        "worker": b.consumer,
        "started_at": repr(time.time()),
        "lease_expires_at": repr(lease.expires_at),
        "fencing_token": str(lease.fencing_token),
        "progress": "0.0",
        "message": "",
    }
    return {**state, **changes}


class RunningStatesContract(ContractBase):
    """The running jobs' states (part of ``RecordsContract``)."""

    async def test_running_job_states_come_from_the_records(self, kit: Kit) -> None:
        b = kit.broker
        records = b.records
        sent = job(45)
        await b.publish([sent])
        assert await records.running_state(sent.id) is None  # queued: not running
        d = await fetch_one(kit, b)
        got, lease = await start(b, d)
        state = await records.running_state(sent.id)
        assert state is not None and set(state) == STATE_KEYS
        assert (state["state"], state["job_id"], state["task"], state["attempt"]) == (
            "running",
            sent.id,
            "work",
            "1",
        )
        assert (state["worker"], state["fencing_token"]) == ("c1", str(lease.fencing_token))
        assert float(state["progress"]) == 0.0 and state["message"] == ""

        # Progress, message and lease expiry go into the record; nothing else does.
        expires = time.time() + 25
        published = running(
            b, sent.id, lease, progress="0.5", message="half", lease_expires_at=repr(expires)
        )
        await records.set_running_state(sent.id, {**published, "task": "x", "worker": "evil"})
        info = await rec(b, sent.id)
        assert (info.progress, info.message, info.task, info.worker) == (0.5, "half", "work", "c1")
        assert info.lease_expires_at is not None
        assert abs(info.lease_expires_at.timestamp() - expires) < 0.01
        state = await records.running_state(sent.id)
        assert state is not None and (state["progress"], state["message"]) == ("0.5", "half")
        assert await records.running_states() == [state]
        if sees_the_same(kit, records.shared):
            other = await kit.consumer("c2")
            assert await other.records.running_state(sent.id) == state
            assert await other.records.running_states() == [state]
        # Another fencing token (a holder that lost the job), or none: nothing changes.
        wrong = str(lease.fencing_token + 1000)
        await records.set_running_state(
            sent.id, {**published, "fencing_token": wrong, "progress": "0.9"}
        )
        without = {k: v for k, v in published.items() if k != "fencing_token"}
        await records.set_running_state(sent.id, {**without, "progress": "0.8"})
        assert (await rec(b, sent.id)).progress == 0.5

        # The job ends: no longer running, and a late state never brings it back.
        assert await b.ack(d, got, lease, 0.0, Finish(keep_for=60)) is True
        done = await rec(b, sent.id)
        await records.set_running_state(sent.id, {**published, "progress": "0.99"})
        assert await rec(b, sent.id) == done
        assert done.state == "succeeded" and done.progress == 0.5
        assert await records.running_state(sent.id) is None
        assert await records.running_states() == []
        # Nor does a state create a record of a job it does not know.
        await records.set_running_state("no-such-job", running(b, "no-such-job", lease))
        assert await records.record("no-such-job") is None
        assert await records.running_state("no-such-job") is None

    async def test_a_running_job_whose_lease_lapsed_stays_listed_until_settled_or_taken_over(
        self, kit: Kit
    ) -> None:
        """Its worker died: its record still says running, so it stays listed, its lease
        expiry in the past (the monitor reports it as orphaned), until its job is settled or
        another worker takes it over (then it is listed as that worker's). Records kept by
        one broker object cannot show a takeover by another: only the settled case runs."""
        b = kit.broker
        records = b.records
        alive, gone, ended = job(46), job(47), job(48)
        await b.publish([alive, gone, ended])
        by_id = {decoded(d).id: d for d in await fetch_n(kit, b, 3)}
        _, lease_a = await start(b, by_id[alive.id])
        _, lease_g = await start(b, by_id[gone.id], ttl=0.3)  # lapses soon: nobody renews it
        _, lease_e = await start(b, by_id[ended.id])
        lapsed = time.time() - 10
        # The worker published the states (a broker may list a job once it was published).
        await records.set_running_state(alive.id, running(b, alive.id, lease_a))
        for sent, lease in ((gone, lease_g), (ended, lease_e)):
            await records.set_running_state(
                sent.id, running(b, sent.id, lease, lease_expires_at=repr(lapsed))
            )

        for sent in (gone, ended):
            assert (await rec(b, sent.id)).state == "running"
            state = await records.running_state(sent.id)
            assert state is not None and state["worker"] == "c1"
            assert float(state["lease_expires_at"]) == pytest.approx(lapsed, abs=0.01)
        listed = {s["job_id"]: s for s in await records.running_states()}
        assert set(listed) == {alive.id, gone.id, ended.id}
        assert float(listed[alive.id]["lease_expires_at"]) > time.time()
        for sent in (gone, ended):
            assert float(listed[sent.id]["lease_expires_at"]) < time.time()  # orphaned
        assert len(await records.running_states(limit=1)) == 1

        # Settled (here by its own lease): no longer running, no longer listed.
        assert await b.ack(by_id[ended.id], ended, lease_e, 0.0, Finish(keep_for=60)) is True
        assert await records.running_state(ended.id) is None
        assert {s["job_id"] for s in await records.running_states()} == {alive.id, gone.id}
        if kit.traits.visibility_lease or not sees_the_same(kit, records.shared):
            assert await b.ack(by_id[gone.id], gone, lease_g) is True
            assert [s["job_id"] for s in await records.running_states()] == [alive.id]
            return

        # Taken over: once its lease key is gone, another worker recovers the entry and
        # starts the job: it is listed as that worker's, the lapsed expiry gone with it.
        await asyncio.sleep(0.4)
        taker = await kit.consumer("c2")
        if kit.traits.window_lease:
            # No reclaim: gone's window runs out by itself (nobody renews it) and the server
            # delivers it again to the taker's fetch, while b keeps renewing alive's.
            recovered = []
            for _ in range(40):
                assert await b.keep_alive(by_id[alive.id]) is True
                recovered = await taker.fetch(10, 0.2)
                if recovered:
                    break
        else:
            recovered = await taker.reclaim(10, lambda _: 0.0, 0.0)  # alive's lease is held
        assert [decoded(d).id for d in recovered] == [gone.id]
        _, lease_t = await start(taker, recovered[0])
        assert lease_t.fencing_token > lease_g.fencing_token
        state = await records.running_state(gone.id)
        assert state is not None
        assert (state["worker"], state["fencing_token"]) == ("c2", str(lease_t.fencing_token))
        assert float(state["lease_expires_at"]) > time.time()
        listed = {s["job_id"]: s for s in await records.running_states()}
        assert set(listed) == {alive.id, gone.id}
        assert all(float(s["lease_expires_at"]) > time.time() for s in listed.values())
        # ...and settled by the new holder: off the list; the old holder's late ack refused.
        assert await taker.ack(recovered[0], gone, lease_t) is True
        assert await b.ack(by_id[gone.id], gone, lease_g) is False
        assert [s["job_id"] for s in await records.running_states()] == [alive.id]
        assert (await rec(b, alive.id)).fencing_token == lease_a.fencing_token
