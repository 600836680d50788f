"""The transport's contract (``Broker``): publish and fetch, ack, keep-alive, retry, give
back, schedule, dead letters and replay, depth and transient errors; with the leases, the
start step and the recovery of abandoned deliveries (``leases.py``)."""

from __future__ import annotations

import asyncio
import time

import pytest

from ...errors import ConfigError
from ._kit import (
    Kit,
    assert_depth,
    decoded,
    failure,
    fetch_n,
    fetch_one,
    job,
    nothing_to_fetch,
)
from .leases import LeaseContract


class TransportContract(LeaseContract):
    """Every broker's transport. Subclass it in a test module and provide a ``subject``
    fixture (``aqw.testing.contract.Subject``)."""

    # -- publish and fetch -------------------------------------------------------------------

    async def test_publish_then_fetch_gives_the_same_bytes_once(self, kit: Kit) -> None:
        b = kit.broker
        sent = job(1)
        await b.publish([sent])
        d = await fetch_one(kit, b)
        assert d.data == sent.encode()
        assert d.delivery_count == 1
        assert decoded(d) == sent
        # While it is unsettled, neither this consumer nor another gets it again.
        other = await kit.consumer("c2")
        assert await b.fetch(10, 0) == []
        assert await other.fetch(10, 0) == []

    async def test_a_blocking_fetch_waits_and_wakes_for_a_job_published_meanwhile(
        self, kit: Kit
    ) -> None:
        """``fetch(count, block)`` on an empty queue waits (other tasks run meanwhile) and
        returns the job another task publishes, without waiting out its block."""
        b = kit.broker
        sent = job(22)
        waiting = asyncio.create_task(b.fetch(10, 5.0))
        await asyncio.sleep(0.1)
        assert not waiting.done()  # it waits, and this task ran meanwhile
        await b.publish([sent])
        async with asyncio.timeout(10):
            got = await waiting
        got += [] if got else await fetch_n(kit, b, 1)  # a slow broker's next poll
        assert [decoded(d) for d in got] == [sent]
        assert await b.ack(got[0], sent, None) is True

    async def test_ack_removes_for_good_and_a_second_ack_is_refused(self, kit: Kit) -> None:
        b = kit.broker
        sent = job(2)
        await b.publish([sent])
        d = await fetch_one(kit, b)
        assert await b.ack(d, sent, None) is True
        await assert_depth(kit, 0, 0, 0, 0)
        assert await b.fetch(10, 0) == []
        assert (await b.stats()).get("processed") == 1
        second = await b.ack(d, sent, None)
        if kit.traits.visibility_lease and second:
            pytest.xfail(
                "a visibility lease: a delete succeeds for a receipt whose message is gone "
                "(SQS DeleteMessage), and the broker keeps no record of settled deliveries"
            )
        assert second is False
        assert (await b.stats()).get("processed") == 1

    async def test_keep_alive_only_for_our_own_unsettled_delivery(self, kit: Kit) -> None:
        b = kit.broker
        sent = job(3)
        await b.publish([sent])
        d = await fetch_one(kit, b)
        other = await kit.consumer("c2")
        assert await b.keep_alive(d) is True
        assert await other.keep_alive(d) is False
        assert await b.ack(d, sent, None) is True
        assert await b.keep_alive(d) is False

    # -- retry, give back, schedule ----------------------------------------------------------

    async def test_retry_is_due_at_its_time_with_the_next_attempt(self, kit: Kit) -> None:
        b = kit.broker
        sent = job(4)
        await b.publish([sent])
        d = await fetch_one(kit, b)
        # The next attempt, with a header the broker carries if it can replace the body.
        nxt = sent.next_attempt().model_copy(update={"headers": {"retried": "yes"}})
        due = time.time() + kit.traits.delay
        assert await b.retry(d, nxt, due, None) is True
        await nothing_to_fetch(b)
        again = await fetch_one(kit, b, within=6)
        assert time.time() >= due - 0.05, "the retry came back before its due time"
        got = decoded(again)
        assert got.id == sent.id and got.attempt == 2
        if kit.traits.visibility_lease:
            # The body cannot change; the attempt is the receive count, rewritten at fetch.
            assert again.delivery_count == 2
            assert got == sent.model_copy(update={"attempt": 2})
        else:
            assert again.data == nxt.encode()
        assert (await b.stats()).get("retried") == 1
        assert await b.ack(again, got, None) is True
        await assert_depth(kit, 0, 0, 0, 0)

    async def test_give_back_is_available_at_once(self, kit: Kit) -> None:
        b = kit.broker
        sent = job(5)
        await b.publish([sent])
        d = await fetch_one(kit, b)
        assert await b.give_back(d, None) is True
        other = await kit.consumer("c2")
        again = await fetch_one(kit, other, within=3)
        got = decoded(again)
        assert got.id == sent.id
        if kit.traits.visibility_lease:
            # Every receive counts as an attempt, one ended by a give-back included.
            assert (got.attempt, again.delivery_count) == (2, 2)
        else:
            assert again.data == sent.encode() and got.attempt == 1
        assert await other.ack(again, got, None) is True
        await assert_depth(kit, 0, 0, 0, 0)

    async def test_schedule_is_not_fetched_before_it_is_due(self, kit: Kit) -> None:
        b = kit.broker
        assert await b.promote_due() is None  # nothing scheduled
        sent = job(6)
        due = time.time() + kit.traits.delay
        await b.schedule([sent], due)
        await assert_depth(kit, 0, 0, 1, 0)
        left = await b.promote_due()
        if kit.traits.approximate_depth:
            assert left is None  # the broker delays the message itself: nothing to move
        else:
            assert left is not None and 0 < left <= kit.traits.delay
        await nothing_to_fetch(b)
        d = await fetch_one(kit, b, within=6)
        assert time.time() >= due - 0.05, "the scheduled job came before its time"
        assert d.data == sent.encode()
        assert await b.ack(d, sent, None) is True

    async def test_scheduled_in_the_past_is_available_now(self, kit: Kit) -> None:
        b = kit.broker
        sent = job(7)
        await b.schedule([sent], time.time() - 5)
        d = await fetch_one(kit, b, within=3)
        assert d.data == sent.encode()

    # -- dead letters ------------------------------------------------------------------------

    async def test_dead_letter_records_the_failure_then_replay_and_delete(self, kit: Kit) -> None:
        b = kit.broker
        sent = job(8)
        await b.publish([sent])
        d = await fetch_one(kit, b)
        why = failure()
        entry_id = await b.dead_letter(d, sent, why, 3, None)
        assert isinstance(entry_id, str) and entry_id  # the new entry's id
        await assert_depth(kit, 0, 0, 0, 1)
        assert (await b.stats()).get("dead") == 1
        await nothing_to_fetch(b)

        [dead] = await b.dlq_list()
        assert dead.id == entry_id
        assert (dead.error_type, dead.error, dead.attempts) == ("ValueError", "bad value 7", 3)
        assert (dead.task, dead.job_id, dead.worker) == ("work", sent.id, "w-1")
        assert dead.data == sent.encode() and dead.job == sent
        assert dead.traceback.startswith("Traceback")
        assert dead.first_failed_at == pytest.approx(why.first_failed_at)
        assert dead.last_failed_at == pytest.approx(why.failed_at)
        one = await b.dlq_get(dead.id)
        assert one is not None and (one.id, one.job_id, one.error) == (dead.id, sent.id, dead.error)
        assert await b.dlq_get("no-such-entry") is None

        # Replay: back on the queue, gone from the DLQ.
        assert await b.dlq_replay([(dead.id, sent)]) == 1
        assert await b.dlq_list() == []
        await assert_depth(kit, 1, 0, 0, 0)
        again = await fetch_one(kit, b)
        assert again.data == sent.encode()

        # Dead again, then purged.
        entry_id = await b.dead_letter(again, sent, failure(error="again"), 4, None)
        [dead2] = await b.dlq_list()
        assert dead2.id == entry_id
        assert (dead2.error, dead2.attempts) == ("again", 4)
        assert await b.dlq_delete([dead2.id]) == 1
        assert await b.dlq_list() == []
        assert await b.dlq_delete([dead2.id]) == 0
        await assert_depth(kit, 0, 0, 0, 0)

    async def test_dead_letter_of_an_undecodable_message(self, kit: Kit) -> None:
        """``job`` is None when the message could not be decoded: the DLQ keeps the raw
        bytes (a broker may read the task and job id back from them)."""
        b = kit.broker
        sent = job(9)
        await b.publish([sent])
        d = await fetch_one(kit, b)
        entry_id = await b.dead_letter(d, None, failure(error_type="MalformedJob"), 1, None)
        [dead] = await b.dlq_list()
        assert dead.id == entry_id
        assert dead.error_type == "MalformedJob" and dead.data == d.data
        assert (dead.task, dead.job_id) in {("", ""), ("work", sent.id)}

    # -- depth -------------------------------------------------------------------------------

    async def test_depth_through_publish_fetch_retry_and_dead_letter(self, kit: Kit) -> None:
        b = kit.broker
        first, second = job(10), job(11)
        await assert_depth(kit, 0, 0, 0, 0)
        await b.publish([first, second])
        await assert_depth(kit, 2, 0, 0, 0)
        deliveries = await fetch_n(kit, b, 2)
        await assert_depth(kit, 0, 2, 0, 0)
        by_id = {decoded(d).id: d for d in deliveries}
        assert await b.retry(by_id[first.id], first.next_attempt(), time.time() + 60, None)
        if kit.traits.approximate_depth:  # a delivery hidden by a retry: in flight
            await assert_depth(kit, 0, 2, 0, 0)
        else:
            await assert_depth(kit, 0, 1, 1, 0)
        assert await b.dead_letter(by_id[second.id], second, failure(), 1, None) is not None
        if kit.traits.approximate_depth:
            await assert_depth(kit, 0, 1, 0, 1)
        else:
            await assert_depth(kit, 0, 0, 1, 1)

    # -- idempotency keys --------------------------------------------------------------------

    async def test_publish_unique_and_completion_records(self, kit: Kit) -> None:
        b = kit.broker
        keyed = job(17, key="order-17")
        if not b.keyed_enqueue:  # refused at enqueue, and no completion records either
            with pytest.raises(ConfigError):
                await b.publish_unique(keyed, 60, None)
            await b.publish([keyed])
            d = await fetch_one(kit, b)
            assert await b.ack(d, keyed, None, record_ttl=60) is True
            assert await b.is_completed(keyed) is False
            return
        assert await b.publish_unique(keyed, 60, None) == (keyed.id, False)
        twin = job(17, key="order-17")
        assert await b.publish_unique(twin, 60, None) == (keyed.id, True)
        await assert_depth(kit, 1, 0, 0, 0)
        d = await fetch_one(kit, b)
        assert d.data == keyed.encode()
        assert await b.is_completed(keyed) is False
        assert await b.ack(d, keyed, None, record_ttl=60) is True
        assert await b.is_completed(keyed) is True
        assert await b.is_completed(job(18, key="other")) is False
        assert await b.is_completed(job(19)) is False

    # -- errors ------------------------------------------------------------------------------

    async def test_transient_errors_include_connection_errors(self, kit: Kit) -> None:
        transient = kit.broker.transient_errors
        assert ConnectionError in transient
        assert issubclass(TimeoutError, transient) and issubclass(OSError, transient)
        for error in kit.traits.transient:
            assert issubclass(error, transient), error
        assert not issubclass(ValueError, transient)
