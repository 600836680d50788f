"""The job records' contract (``broker.records``, a ``JobRecords`` part; ``aqw/record.py``):
each step of a job moves its record (publish, schedule, the start step, ack, retry,
dead-letter, give back, replay), cancellation, waiting for a job's end, expiry, a refused
settle that leaves the record alone; and the running jobs' states (``running.py``)."""

from __future__ import annotations

import asyncio
import time

import pytest

from ...brokers.messages import Finish
from ...errors import JobCancelled, UnknownJob
from ...lease import Lease
from ...record import JobError
from ._kit import (
    Kit,
    at,
    decoded,
    eventually,
    failure,
    fetch_n,
    fetch_one,
    job,
    rec,
    sees_the_same,
    start,
)
from .running import RunningStatesContract


class RecordsContract(RunningStatesContract):
    """Every broker's job records (each case on one broker object, unless it says so)."""

    async def test_records_say_whether_they_are_shared(self, kit: Kit) -> None:
        assert isinstance(kit.broker.records.shared, bool)

    async def test_record_of_a_job_from_queued_to_succeeded(self, kit: Kit) -> None:
        b = kit.broker
        sent = job(30)
        await b.publish([sent])
        queued = await rec(b, sent.id)
        assert (queued.state, queued.queue, queued.task, queued.attempts) == (
            "queued",
            kit.queue,
            "work",
            0,
        )
        assert queued.enqueued_at == at(sent.enqueued_at)
        assert (queued.started_at, queued.finished_at, queued.error, queued.key) == (None,) * 4
        assert not queued.finished and not queued.cancel_requested

        d = await fetch_one(kit, b)
        before = time.time()
        got, lease = await start(b, d)
        after = time.time()
        run = await rec(b, sent.id)
        assert (run.state, run.attempts, run.worker) == ("running", 1, "c1")
        assert run.started_at is not None
        assert at(before - 0.01) <= run.started_at <= at(after + 0.01)
        assert run.fencing_token == lease.fencing_token > 0
        assert run.lease_expires_at is not None and run.lease_expires_at > at(after + 20)
        assert run.enqueued_at == queued.enqueued_at

        finish = Finish("succeeded", keep_for=60, result='{"n": 30}')
        assert await b.ack(d, got, lease, 0.0, finish) is True
        done = await rec(b, sent.id)
        assert (done.state, done.attempts, done.finished) == ("succeeded", 1, True)
        assert done.has_result and done.result == {"n": 30}
        assert done.started_at == run.started_at
        assert done.finished_at is not None
        assert run.started_at <= done.finished_at <= at(time.time())
        assert await b.records.cancel(sent.id) == "finished"
        assert await rec(b, sent.id) == done  # a cancel of a finished job changes nothing

    async def test_records_of_delayed_and_given_back_jobs(self, kit: Kit) -> None:
        b = kit.broker
        later, past = job(31), job(32)
        due = time.time() + 60
        await b.schedule([later], due)
        await b.schedule([past], time.time() - 5)
        delayed = await rec(b, later.id)
        assert delayed.state == "delayed" and not delayed.finished
        assert delayed.run_at is not None and abs(delayed.run_at.timestamp() - due) < 1.0
        assert (await rec(b, past.id)).state == "queued"

        d = await fetch_one(kit, b, within=3)
        got, lease = await start(b, d)
        assert got.id == past.id and (await rec(b, past.id)).state == "running"
        assert await b.give_back(d, lease, got) is True
        back = await rec(b, past.id)
        assert (back.state, back.attempts) == ("queued", 1)  # its story stays: it ran once

    async def test_publish_unique_records_the_job_with_its_key(self, kit: Kit) -> None:
        b = kit.broker
        if not b.keyed_enqueue:
            pytest.skip(f"the {b.system} broker has no idempotency keys at enqueue")
        keyed = job(33, key="order-33")
        assert await b.publish_unique(keyed, 60, None) == (keyed.id, False)
        twin = job(33, key="order-33")
        assert await b.publish_unique(twin, 60, None) == (keyed.id, True)
        info = await rec(b, keyed.id)
        assert (info.state, info.key) == ("queued", "order-33")
        assert await b.records.record(twin.id) is None  # the duplicate wrote nothing
        later = job(34, key="order-34")
        await b.publish_unique(later, 60, time.time() + 60)
        assert (await rec(b, later.id)).state == "delayed"

    async def test_retry_records_the_error_and_the_last_attempt_fails(self, kit: Kit) -> None:
        b = kit.broker
        sent = job(35)
        await b.publish([sent])
        d = await fetch_one(kit, b)
        got, lease = await start(b, d)
        due = time.time() + kit.traits.delay
        why = failure(fingerprint="fp-35")
        assert await b.retry(d, got.next_attempt(), due, lease, why) is True
        retrying = await rec(b, sent.id)
        assert (retrying.state, retrying.attempts, retrying.finished) == ("retrying", 1, False)
        assert retrying.run_at is not None and abs(retrying.run_at.timestamp() - due) < 1.5
        assert retrying.error == JobError(
            type="ValueError", message="bad value 7", fingerprint="fp-35", traceback=why.traceback
        )

        again = await fetch_one(kit, b, within=6)
        got2, lease2 = await start(b, again)
        second = await rec(b, sent.id)
        assert (second.state, second.attempts) == ("running", 2)
        assert second.fencing_token == lease2.fencing_token > lease.fencing_token
        last = failure(error_type="KeyError", error="gone", fingerprint="fp-k")
        assert await b.ack(again, got2, lease2, 0.0, Finish("failed", 60, failure=last)) is True
        failed = await rec(b, sent.id)
        assert (failed.state, failed.attempts, failed.finished) == ("failed", 2, True)
        assert failed.error is not None
        assert (failed.error.type, failed.error.message, failed.error.fingerprint) == (
            "KeyError",
            "gone",
            "fp-k",
        )
        assert failed.dlq_entry is None and not failed.has_result

    async def test_dead_letter_record_names_the_entry_and_replay_queues_it(self, kit: Kit) -> None:
        b = kit.broker
        sent = job(36)
        await b.publish([sent])
        d = await fetch_one(kit, b)
        got, lease = await start(b, d)
        why = failure(fingerprint="fp-36")
        entry_id = await b.dead_letter(d, got, why, 1, lease, keep_for=60)
        assert entry_id
        dead = await rec(b, sent.id)
        assert (dead.state, dead.finished, dead.dlq_entry) == ("dead", True, entry_id)
        assert dead.error == JobError(
            type="ValueError", message="bad value 7", fingerprint="fp-36", traceback=why.traceback
        )
        assert dead.finished_at is not None and dead.attempts == 1
        [entry] = await b.dlq_list()
        assert entry.id == entry_id

        assert await b.dlq_replay([(entry_id, sent)]) == 1
        replayed = await rec(b, sent.id)
        assert (replayed.state, replayed.finished, replayed.dlq_entry) == ("queued", False, None)
        assert replayed.finished_at is None
        again = await fetch_one(kit, b)
        got, lease = await start(b, again)
        assert (await rec(b, sent.id)).state == "running"
        assert await b.ack(again, got, lease) is True  # Finish() by default: succeeded
        assert (await rec(b, sent.id)).state == "succeeded"

    async def test_ends_unrun_cancelled_and_expired(self, kit: Kit) -> None:
        b = kit.broker
        old = job(37, expires_at=time.time() - 1)
        await b.publish([old])
        d = await fetch_one(kit, b)
        assert (await rec(b, old.id)).expires_at == at(old.expires_at or 0)
        assert await b.ack(d, decoded(d), None, 0.0, Finish("expired", 60)) is True
        expired = await rec(b, old.id)
        assert (expired.state, expired.finished, expired.started_at) == ("expired", True, None)
        assert await b.records.cancel(old.id) == "finished"

    async def test_cancel_a_queued_job_refuses_its_start(self, kit: Kit) -> None:
        b = kit.broker
        records = b.records
        sent = job(38)
        await b.publish([sent])
        assert await records.cancel_requested(sent.id) is False
        assert await records.cancel(sent.id, 60) == "cancelled"
        cancelled = await rec(b, sent.id)
        assert (cancelled.state, cancelled.finished, cancelled.cancel_requested) == (
            "cancelled",
            True,
            True,
        )
        assert cancelled.finished_at is not None and cancelled.started_at is None
        assert await records.cancel_requested(sent.id) is True
        assert await records.cancel(sent.id) == "finished"
        d = await fetch_one(kit, b)  # its message is still delivered...
        key = b.job_lease_key(sent)
        with pytest.raises(JobCancelled):  # ...and its start refused, taking nothing
            await b.job_lease_backend(sent).acquire(key, "token-a", 5000)
        assert await b.lease_backend().renew(key, "token-a", 5000) is False
        assert (await rec(b, sent.id)).started_at is None
        assert (await records.wait_finished(sent.id, 1)).state == "cancelled"
        assert await b.ack(d, decoded(d), None, 0.0, Finish("cancelled", 60)) is True
        assert (await rec(b, sent.id)).state == "cancelled"

    async def test_cancel_a_running_job_asks_it_to_stop(self, kit: Kit) -> None:
        b = kit.broker
        sent = job(39)
        await b.publish([sent])
        d = await fetch_one(kit, b)
        got, lease = await start(b, d)
        assert await b.records.cancel(sent.id) == "cancelling"
        info = await rec(b, sent.id)
        assert (info.state, info.cancel_requested, info.finished) == ("running", True, False)
        assert await b.records.cancel_requested(sent.id) is True
        assert await b.records.cancel(sent.id) == "cancelling"  # asked again: on its way
        assert await b.ack(d, got, lease, 0.0, Finish("cancelled", 60)) is True
        ended = await rec(b, sent.id)
        assert (ended.state, ended.finished, ended.attempts) == ("cancelled", True, 1)

    async def test_a_running_jobs_cancel_is_pushed_to_the_watchers(self, kit: Kit) -> None:
        """A broker that says ``pushes_cancels`` calls every ``watch_cancels`` of its queue
        (another consumer's too) with the id of a running job cancelled; one that does not
        returns from ``watch_cancels`` at once (its workers read renewals)."""
        b = kit.broker
        if not b.pushes_cancels:
            await asyncio.wait_for(b.watch_cancels(lambda job_id: None), 5)
            pytest.skip("this broker's workers read a cancel with the job's lease renewals")
        other = await kit.consumer()
        heard: list[str] = []
        watchers = [asyncio.ensure_future(x.watch_cancels(heard.append)) for x in (b, other)]
        try:
            sent = job(40)
            await b.publish([sent])
            d = await fetch_one(kit, b)
            got, lease = await start(b, d)

            async def both_heard() -> bool:  # asked again until both listen: at most once
                assert await b.records.cancel(sent.id) == "cancelling"
                await asyncio.sleep(0.05)
                return heard.count(sent.id) >= 2 and set(heard) == {sent.id}

            await eventually(both_heard, 10, "the cancel pushed to both watchers")
            assert await b.ack(d, got, lease, 0.0, Finish("cancelled", 60)) is True
        finally:
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)

    async def test_an_unknown_job_has_no_record(self, kit: Kit) -> None:
        records = kit.broker.records
        assert await records.record("no-such-job") is None
        assert await records.cancel("no-such-job") == "unknown"
        assert await records.cancel_requested("no-such-job") is False
        assert await records.running_state("no-such-job") is None
        with pytest.raises(UnknownJob):
            await records.wait_finished("no-such-job", 1)
        with pytest.raises(UnknownJob):
            await records.wait_finished("no-such-job", None)
        assert await records.record("no-such-job") is None  # asking created nothing

    async def test_wait_finished_returns_wakes_and_times_out(self, kit: Kit) -> None:
        b = kit.broker
        first, second = job(40), job(41)
        await b.publish([first, second])
        # Several callers wait for one job: every one of them is woken by its ack.
        waiters = [asyncio.create_task(b.records.wait_finished(first.id, 10)) for _ in range(3)]
        if sees_the_same(kit, b.records.shared):  # another broker waits on the same records
            other = await kit.consumer("c2")
            waiters.append(asyncio.create_task(other.records.wait_finished(first.id, 10)))
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            await b.records.wait_finished(second.id, 0.3)
        assert time.monotonic() - t0 >= 0.29
        assert not any(w.done() for w in waiters)

        deliveries = {decoded(d).id: d for d in await fetch_n(kit, b, 2)}
        d = deliveries[first.id]
        got, lease = await start(b, d)
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in waiters)  # running is not an end
        assert await b.ack(d, got, lease, 0.0, Finish("succeeded", 60, result="[1, 2]")) is True
        async with asyncio.timeout(5):
            ended = await asyncio.gather(*waiters)
        assert [(i.id, i.state, i.result) for i in ended] == [
            (first.id, "succeeded", [1, 2])
        ] * len(waiters)
        assert (await b.records.wait_finished(first.id, 5)).state == "succeeded"  # at once
        assert (await b.records.wait_finished(first.id, None)).result == [1, 2]
        # A waiter that gives up (timeout, cancel) leaves nothing behind to wake later.
        pending = asyncio.create_task(b.records.wait_finished(second.id, None))
        await asyncio.sleep(0.05)
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
        d2 = deliveries[second.id]
        got2, lease2 = await start(b, d2)
        assert await b.ack(d2, got2, lease2) is True
        assert (await b.records.wait_finished(second.id, 1)).state == "succeeded"

    async def test_records_expire_after_keep_for(self, kit: Kit) -> None:
        b = kit.broker
        acked, dead = job(42), job(43)
        await b.publish([acked, dead])
        by_id = {decoded(d).id: d for d in await fetch_n(kit, b, 2)}
        got, lease = await start(b, by_id[acked.id])
        waiter = asyncio.create_task(b.records.wait_finished(acked.id, 10))
        await asyncio.sleep(0.05)
        assert await b.ack(by_id[acked.id], got, lease, 0.0, Finish(keep_for=0.3)) is True
        got2, lease2 = await start(b, by_id[dead.id])
        assert await b.dead_letter(by_id[dead.id], got2, failure(), 1, lease2, keep_for=0.3)
        assert (await waiter).state == "succeeded"  # woken with the record as it ended
        assert (await rec(b, acked.id)).state == "succeeded"
        assert (await rec(b, dead.id)).state == "dead"
        await asyncio.sleep(0.5)
        assert await b.records.record(acked.id) is None
        assert await b.records.record(dead.id) is None
        assert await b.records.cancel(acked.id) == "unknown"
        with pytest.raises(UnknownJob):
            await b.records.wait_finished(dead.id, 1)

    async def test_a_refused_settle_leaves_the_record_as_it_was(self, kit: Kit) -> None:
        b = kit.broker
        sent = job(44)
        await b.publish([sent])
        d = await fetch_one(kit, b)
        got, lease = await start(b, d)
        before = await rec(b, sent.id)

        async def unchanged() -> None:
            assert await rec(b, sent.id) == before
            if kit.traits.window_lease:  # the holder keeps its window, as its keeper would
                assert await b.keep_alive(d) is True

        # Another holder's lease: not the one that holds the job now.
        stale = Lease(b.job_lease_backend(got), b.job_lease_key(got), ttl=30)
        assert await b.ack(d, got, stale, 0.0, Finish("succeeded", 60, result="1")) is False
        await unchanged()
        assert await b.retry(d, got.next_attempt(), time.time() + 60, stale, failure()) is False
        await unchanged()
        assert await b.dead_letter(d, got, failure(), 1, stale) is None
        await unchanged()
        assert await b.ack(d, got, lease) is True
        assert (await rec(b, sent.id)).state == "succeeded"
