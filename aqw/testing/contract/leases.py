"""The transport's leases (``Broker.lease_backend``, ``job_lease_backend``): fencing tokens
that grow, refusals, expiry; the start step, only for a live delivery (nothing taken after
a takeover, nor for an ended job); and the recovery of abandoned deliveries (``reclaim``, a
held lease, ``give_back_unstarted``)."""

from __future__ import annotations

import asyncio

import pytest

from ...brokers.messages import Finish
from ...errors import JobCancelled, StaleStart
from ...flow import Limits
from ...job import Job
from ...lease import Lease
from ._kit import (
    ContractBase,
    Kit,
    assert_depth,
    decoded,
    fetch_n,
    fetch_one,
    job,
    nothing_to_fetch,
    rec,
    start,
)


class LeaseContract(ContractBase):
    """Leases, the start step and recovery (part of ``TransportContract``)."""

    async def test_job_lease_fencing_refusal_and_wrong_token_release(self, kit: Kit) -> None:
        b = kit.broker
        sent = job(12)
        await b.publish([sent])
        d = await fetch_one(kit, b)  # a visibility lease: the delivery is the lease
        leases = b.lease_backend()
        key = b.job_lease_key(sent)
        assert sent.id in key and kit.queue in key

        first = await leases.acquire(key, "token-a", 5000)
        assert first is not None and first >= 1
        assert await leases.acquire(key, "token-b", 5000) is None
        released = await leases.release(key, "token-b")
        if not kit.traits.visibility_lease:
            assert released is False
        # (A visibility lease's release only forgets the handle and may answer True whoever
        # asks; either way the holder keeps its lease, as the next acquire shows.)
        assert await leases.acquire(key, "token-c", 5000) is None
        assert await leases.renew(key, "token-a", 5000) is True
        assert await leases.renew(key, "token-c", 5000) is False
        assert await leases.release(key, "token-a") is True

        # The job delivered again: a new holder gets a greater fencing token.
        assert await b.give_back(d, None) is True
        again = await fetch_one(kit, b, within=3)
        second = await leases.acquire(key, "token-c", 5000)
        assert second is not None and second > first
        assert await b.ack(again, sent, None) is True

    async def test_lock_lease_fencing_tokens_grow(self, kit: Kit) -> None:
        """``ctx.lock(name)`` leases (on SQS without ``locks=``: local to the process)."""
        b = kit.broker
        leases = b.lease_backend()
        key = b.lock_key("customer:7")
        assert "customer:7" in key and kit.queue in key
        first = await leases.acquire(key, "a", 5000)
        assert first is not None
        assert await leases.acquire(key, "b", 5000) is None
        assert await leases.release(key, "b") is False
        assert await leases.acquire(key, "b", 5000) is None
        assert await leases.release(key, "a") is True
        second = await leases.acquire(key, "b", 5000)
        assert second is not None and second > first
        assert await leases.release(key, "b") is True

    async def test_lease_expires_after_its_ttl(self, kit: Kit) -> None:
        leases = kit.broker.lease_backend()
        key = kit.broker.lock_key("short")
        assert await leases.acquire(key, "a", 200) is not None
        assert await leases.acquire(key, "b", 200) is None
        await asyncio.sleep(0.35)
        assert await leases.renew(key, "a", 200) is False
        assert await leases.acquire(key, "b", 5000) is not None

    # -- the start step ----------------------------------------------------------------------

    async def test_the_start_step_marks_the_record_running_and_refuses_a_cancelled_job(
        self, kit: Kit
    ) -> None:
        b = kit.broker
        run, skip = job(20), job(21)
        await b.publish([run, skip])
        by_id = {decoded(d).id: d for d in await fetch_n(kit, b, 2)}
        lease_key = b.job_lease_key(run)
        fence = await b.job_lease_backend(run).acquire(lease_key, "token-a", 5000)
        assert fence is not None and fence >= 1
        info = await rec(b, run.id)
        assert (info.state, info.fencing_token, info.worker) == ("running", fence, "c1")
        assert await b.records.cancel(skip.id) == "cancelled"
        key = b.job_lease_key(skip)
        with pytest.raises(JobCancelled):
            await b.job_lease_backend(skip).acquire(key, "token-b", 5000)
        assert await b.lease_backend().renew(key, "token-b", 5000) is False  # nothing taken
        assert (await rec(b, skip.id)).started_at is None
        assert await b.ack(by_id[run.id], run, None) is True
        assert await b.ack(by_id[skip.id], skip, None) is True

    # -- a start is only for a live delivery -------------------------------------------------

    async def test_a_start_after_a_takeover_and_settle_takes_nothing(self, kit: Kit) -> None:
        """Consumer A fetches and pauses past its lease; B takes the delivery over (reclaim,
        or a visibility lease that ran out), runs and acknowledges it; then A's start is
        refused (``StaleStart``), in the same step as the lease it would take: no lease key,
        no fencing token handed out, the record as B's settle left it (records kept by each
        broker object: A's reads as A left it). Under its limits too, refused before them."""
        a = await kit.consumer("a", visibility=1)  # a 1 s visibility on receive
        b = await kit.consumer("b")
        sent = job(60)
        await a.publish([sent])
        d = await fetch_one(kit, a)
        if kit.traits.comes_back:
            again = await fetch_one(kit, b, within=6)
        else:
            await asyncio.sleep(0.1)
            [again] = await b.reclaim(10, lambda _: 0.05, 0.05)
        got, lease_b = await start(b, again)
        assert await b.ack(again, got, lease_b, 0.0, Finish(keep_for=60)) is True
        settled = await rec(b, sent.id)
        mine = await rec(a, sent.id)

        key = a.job_lease_key(sent)
        backends = [a.job_lease_backend(sent, None, d)]
        if a.flow_limits is not None:
            limits = Limits("b", 10**9, 0, (("k", 1),))
            backends.append(a.job_lease_backend(sent, limits, d))
        for backend in backends:
            stale = Lease(backend, key, ttl=30)
            with pytest.raises(StaleStart) as refused:
                await stale.acquire()
            assert refused.value.job_id == sent.id and not refused.value.ended
            assert stale.fencing_token == 0
            assert await a.lease_backend().renew(key, stale.token, 5000) is False  # none taken
        assert await rec(b, sent.id) == settled
        assert await rec(a, sent.id) == mine
        if not kit.traits.comes_back:
            assert settled.state == "succeeded" and settled.fencing_token == lease_b.fencing_token
            # The next fencing token of the job's counter follows B's: A was handed none.
            assert await a.lease_backend().acquire(key, "probe", 5000) == lease_b.fencing_token + 1
            assert await a.lease_backend().release(key, "probe") is True
        assert await a.keep_alive(d) is False
        await assert_depth(kit, 0, 0, 0, 0)

    async def test_a_start_of_an_ended_job_takes_nothing_and_drops_its_delivery(
        self, kit: Kit
    ) -> None:
        """The job's record has ended while a delivery of it is still pending to this
        consumer (here a second copy of the job): its start is refused (``StaleStart`` with
        ``ended``), takes nothing and leaves the record as it was; the leftover delivery is
        dropped unrun."""
        b = kit.broker
        sent = job(61)
        await b.publish([sent, sent])
        first, second = await fetch_n(kit, b, 2)
        got, lease = await start(b, first)
        assert await b.ack(first, got, lease, 0.0, Finish(keep_for=60, result="1")) is True
        ended = await rec(b, sent.id)
        assert ended.state == "succeeded"
        key = b.job_lease_key(sent)
        stale = Lease(b.job_lease_backend(sent, None, second), key, ttl=30)
        with pytest.raises(StaleStart) as refused:
            await stale.acquire()
        assert refused.value.ended
        assert stale.fencing_token == 0
        assert await b.lease_backend().renew(key, stale.token, 5000) is False
        assert await rec(b, sent.id) == ended
        assert await b.keep_alive(second) is False  # dropped
        await assert_depth(kit, 0, 0, 0, 0)
        await nothing_to_fetch(b)

    # -- recovery of abandoned deliveries ----------------------------------------------------

    async def test_reclaim_of_an_abandoned_delivery(self, kit: Kit) -> None:
        sent = job(13)
        holder = await kit.consumer("holder", visibility=1)  # a 1 s visibility on receive
        rescuer = await kit.consumer("rescuer")
        await kit.broker.publish([sent])
        d = await fetch_one(kit, holder)

        def ttl(_: Job | None) -> float:
            return 0.2

        if kit.traits.comes_back:
            # Reclaim recovers nothing; the visibility timeout (or the lapsed window) brings
            # the message back, and the receive counts as the next delivery.
            assert await rescuer.reclaim(10, ttl, 0.2) == []
            again = await fetch_one(kit, rescuer, within=6)
            assert again.delivery_count == 2 and decoded(again).id == sent.id
            if kit.traits.window_lease:
                # The holder's window has passed: its renewal and its late ack are refused
                # (the server would take the ack, the message being redelivered).
                assert await holder.keep_alive(d) is False
                assert await holder.ack(d, sent, None) is False
            assert await rescuer.ack(again, decoded(again), None) is True
            await assert_depth(kit, 0, 0, 0, 0)
            return

        assert await rescuer.reclaim(10, ttl, 0.2) == []  # not idle long enough yet
        leases = holder.lease_backend()
        key = holder.job_lease_key(sent)
        assert await leases.acquire(key, "holder-token", 10_000) is not None
        await asyncio.sleep(0.3)
        assert await rescuer.reclaim(10, ttl, 0.2) == []  # a live holder is never robbed
        assert await leases.release(key, "holder-token") is True
        [again] = await rescuer.reclaim(10, ttl, 0.2)
        assert again.id == d.id and again.data == d.data and again.delivery_count == 2
        assert await holder.keep_alive(d) is False  # no longer ours
        assert await holder.ack(d, sent, None) is False  # the rescuer owns it now
        assert await rescuer.ack(again, sent, None) is True
        await assert_depth(kit, 0, 0, 0, 0)

    async def test_a_held_lease_keeps_the_delivery(self, kit: Kit) -> None:
        """A holder whose lease is held keeps its delivery past the broker's own timeout
        (reclaim skips it; a visibility lease extends the visibility)."""
        sent = job(14)
        holder = await kit.consumer("holder", visibility=1)
        rescuer = await kit.consumer("rescuer")
        await kit.broker.publish([sent])
        d = await fetch_one(kit, holder)
        leases = holder.lease_backend()
        key = holder.job_lease_key(sent)
        assert await leases.acquire(key, "t", 3000) is not None
        if kit.traits.window_lease:
            # The window is kept by renewing it (the lease keeper sends keep_alive with
            # every renewal): renewed within it, past its first end.
            for _ in range(5):
                await asyncio.sleep(0.3)
                assert await holder.keep_alive(d) is True
        else:
            await asyncio.sleep(1.5 if kit.traits.visibility_lease else 0.3)  # past the timeout
        assert await holder.keep_alive(d) is True
        assert await rescuer.reclaim(10, lambda _: 0.2, 0.2) == []
        assert await rescuer.fetch(10, 0) == []
        assert await holder.ack(d, sent, None) is True

    async def test_give_back_unstarted(self, kit: Kit) -> None:
        b = kit.broker
        await b.publish([job(15), job(16)])
        got = await fetch_n(kit, b, 2)
        given = await b.give_back_unstarted({got[0].id})
        if kit.traits.visibility_lease:
            # Deliveries time out by themselves: nothing to give back here.
            assert given == 0
            return
        assert given == 1
        other = await kit.consumer("c2")
        again = await fetch_one(kit, other)
        assert again.data == got[1].data
        assert await b.keep_alive(got[0]) is True
