"""``LocalJobRecords`` (aqw/brokers/local/records.py), the in-process job records of the memory
and SQS brokers: their bound, their expiry, the callers waiting for a job to end, the
running-job states read from them, and ``LocalStartGuard`` (aqw/brokers/_local_start.py),
the job lease that starts a job.

Times are a fake clock where a test is about expiry (the module's ``time``, patched), and
real, short, where asyncio has to wait."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import aqw
from aqw.brokers.local import records as lr
from aqw.brokers.local.records import LEASE_GRACE, LocalJobRecords, running_state
from aqw.brokers.local.start import LocalStartGuard
from aqw.brokers.memory import MemoryLeaseBackend
from aqw.record import DEFAULT_KEEP_FOR, UNFINISHED_KEEP

pytestmark = pytest.mark.timeout(30)


class Clock:
    """Stands in for the ``time`` module of ``local/records.py``: both clocks move together."""

    def __init__(self) -> None:
        self.wall = 1_800_000_000.0
        self.mono = 1_000.0

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(lr, "clock", fake)
    return fake


def job(n: int = 1, **fields: Any) -> aqw.Job:
    return aqw.Job(id=f"j{n}", task="work", payload={"n": n}, **fields)


def ended(records: LocalJobRecords, j: aqw.Job, keep_for: float = 60.0, **fields: str) -> None:
    records.finish(j, "succeeded", {"finished_at": repr(time.time()), **fields}, keep_for)


def state_of(records: LocalJobRecords, job_id: str) -> str | None:
    info = records.info(job_id)
    return None if info is None else info.state


# -- the bound -------------------------------------------------------------------------------


def test_past_the_bound_the_records_closest_to_their_end_go_first(clock: Clock) -> None:
    records = LocalJobRecords("q", limit=3)
    for n in (1, 2, 3):
        records.enqueued(job(n))
        clock.advance(1)
    ended(records, job(1), keep_for=60)  # written last, but its end is the soonest
    records.enqueued(job(4))
    assert len(records) == 3
    assert records.info("j1") is None
    assert [state_of(records, f"j{n}") for n in (2, 3, 4)] == ["queued"] * 3
    records.enqueued(job(5))  # all unfinished now: the one enqueued first ends first
    assert records.info("j2") is None
    assert [state_of(records, f"j{n}") for n in (3, 4, 5)] == ["queued"] * 3


def test_the_default_bound_holds_many_records() -> None:
    records = LocalJobRecords("q", limit=lr.MAX_RECORDS)
    assert lr.MAX_RECORDS >= 10_000
    small = LocalJobRecords("q", limit=100)
    for n in range(1000):
        small.enqueued(job(n))
        ended(small, job(n), keep_for=60)
    assert len(small) == 100
    assert [small.info(f"j{n}") is not None for n in (899, 900, 999)] == [False, True, True]
    assert len(records) == 0


def test_rewriting_one_record_keeps_the_index_small(clock: Clock) -> None:
    records = LocalJobRecords("q")
    j = job(1)
    records.enqueued(j)
    for fence in range(1, 5001):
        records.started(j, "w", fence, clock.wall + 30)
        records.given_back(j.id)
    assert len(records) == 1
    assert len(records._ends) <= 2 * len(records) + 1024


# -- expiry ----------------------------------------------------------------------------------


async def test_a_finished_record_lives_keep_for(clock: Clock) -> None:
    records = LocalJobRecords("q")
    j = job(1)
    records.enqueued(j)
    ended(records, j, keep_for=10)
    clock.advance(9.9)
    assert state_of(records, j.id) == "succeeded"
    clock.advance(0.2)
    assert records.info(j.id) is None
    assert len(records) == 0 and await records.cancel(j.id, 60) == "unknown"


def test_expired_records_are_swept_without_being_read(clock: Clock) -> None:
    records = LocalJobRecords("q")
    for n in range(50):
        records.enqueued(job(n))
        ended(records, job(n), keep_for=5)
    clock.advance(6)
    records.enqueued(job(99))  # a write sweeps what has ended
    assert len(records._records) == 1


def test_an_unfinished_record_lives_unfinished_keep_past_its_due_time(clock: Clock) -> None:
    records = LocalJobRecords("q")
    later = job(1)
    records.enqueued(later, run_at=clock.wall + 100)
    records.enqueued(job(2))
    clock.advance(UNFINISHED_KEEP - 1)
    assert records.info("j1") is not None
    assert state_of(records, "j2") == "queued"
    clock.advance(2)
    assert records.info("j2") is None
    assert records.info("j1") is not None
    clock.advance(100)
    assert records.info("j1") is None


async def test_a_cancelled_job_keeps_its_record_while_its_message_may_still_come(
    clock: Clock,
) -> None:
    """Its message is still queued: were its record to end at ``keep_for``, a worker that
    fetched it later would find no record and run it."""
    records = LocalJobRecords("q")
    j = job(1)
    records.enqueued(j, run_at=clock.wall + 3600)
    assert await records.cancel(j.id, 60) == "cancelled"
    clock.advance(3600 + 60)
    assert state_of(records, j.id) == "cancelled"
    with pytest.raises(aqw.JobCancelled):
        records.started(j, "w", 1, clock.wall + 30)
    clock.advance(UNFINISHED_KEEP)
    assert records.info(j.id) is None


# -- steps -------------------------------------------------------------------------------------


def test_the_steps_of_a_job(clock: Clock) -> None:
    records = LocalJobRecords("q")
    j = job(1, key="k-1")
    records.enqueued(j, run_at=clock.wall + 5)
    info = records.info(j.id)
    assert info is not None and (info.state, info.key, info.attempts) == ("delayed", "k-1", 0)
    records.started(j, "w-1", 7, clock.wall + 30)
    info = records.info(j.id)
    assert info is not None and (info.state, info.attempts, info.worker) == ("running", 1, "w-1")
    assert info.run_at is None and info.fencing_token == 7
    failure = {"error_type": "ValueError", "error": "bad", "fingerprint": "fp", "traceback": ""}
    records.retrying(j.next_attempt(), clock.wall + 10, failure)
    info = records.info(j.id)
    assert info is not None and (info.state, info.attempts) == ("retrying", 1)
    assert info.error is not None and info.error.fingerprint == "fp"
    records.started(j.next_attempt(), "w-2", 8, clock.wall + 30)
    records.finish(j, "dead", {**failure, "dlq_entry": "1-1"}, 60)
    info = records.info(j.id)
    assert info is not None and (info.state, info.dlq_entry, info.attempts) == ("dead", "1-1", 2)
    records.replayed(j)
    info = records.info(j.id)
    assert info is not None and (info.state, info.dlq_entry, info.attempts) == ("queued", None, 2)
    assert info.error is not None  # its last error stays in its story


def test_requeued_only_moves_a_running_record(clock: Clock) -> None:
    records = LocalJobRecords("q")
    j = job(1)
    records.enqueued(j)
    ended(records, j)
    records.given_back(j.id)
    assert state_of(records, j.id) == "succeeded"
    records.given_back("unknown")
    assert records.info("unknown") is None


async def test_a_cancel_asked_while_running_refuses_a_later_start(clock: Clock) -> None:
    """Its worker died (or handed it back) before it could stop: the job's next delivery
    is not run again; a replay from the DLQ drops the request."""
    records = LocalJobRecords("q")
    j = job(1)
    records.enqueued(j)
    records.started(j, "w", 1, clock.wall + 30)
    assert await records.cancel(j.id, 60) == "cancelling"
    assert await records.cancel_requested(j.id) and records.is_cancelled(j.id)
    records.given_back(j.id)
    with pytest.raises(aqw.JobCancelled):
        records.started(j, "w", 2, clock.wall + 30)
    records.finish(j, "dead", {"dlq_entry": "1-1"}, 60)
    records.replayed(j)
    assert not records.is_cancelled(j.id)
    records.started(j, "w", 3, clock.wall + 30)
    assert state_of(records, j.id) == "running"


async def test_update_changes_only_a_running_record_under_its_fence(clock: Clock) -> None:
    records = LocalJobRecords("q")
    j = job(1)
    records.enqueued(j)
    records.update(j.id, {"progress": "0.5"})
    info = records.info(j.id)
    assert info is not None and info.progress == 0.0  # queued: not running
    records.started(j, "w", 4, clock.wall + 30)
    records.update(j.id, {"progress": "0.5", "state": "succeeded", "worker": "x"}, 4)
    records.update(j.id, {"progress": "0.9"}, 5)
    await records.set_running_state(j.id, {"progress": "0.8"})  # no fencing token
    await records.set_running_state(j.id, {"progress": "0.7", "fencing_token": "junk"})
    info = records.info(j.id)
    assert info is not None and (info.state, info.worker, info.progress) == ("running", "w", 0.5)
    await records.set_running_state(j.id, {"progress": "0.6", "message": "m", "fencing_token": "4"})
    info = records.info(j.id)
    assert info is not None and (info.progress, info.message) == (0.6, "m")
    ended(records, j)
    records.update(j.id, {"progress": "1.0"})
    info = records.info(j.id)
    assert info is not None and (info.state, info.progress) == ("succeeded", 0.6)


def test_a_record_running_for_days_does_not_expire(clock: Clock) -> None:
    records = LocalJobRecords("q")
    j = job(1)
    records.started(j, "w", 1, clock.wall + 30)
    for _ in range(20):
        clock.advance(UNFINISHED_KEEP / 4)
        records.update(j.id, {"lease_expires_at": repr(clock.wall + 30)}, 1)
    assert state_of(records, j.id) == "running"


# -- running-job states ----------------------------------------------------------------------


async def test_running_states_keep_jobs_whose_worker_died(clock: Clock) -> None:
    records = LocalJobRecords("q")
    for n in (1, 2, 3):
        records.enqueued(job(n))
        records.started(job(n), "w", n, clock.wall + 10)
    ended(records, job(3))
    states = await records.running_states(100)
    assert [s["job_id"] for s in states] == ["j1", "j2"]
    assert states[0] == {
        "state": "running",
        "job_id": "j1",
        "task": "work",
        "attempt": "1",
        "worker": "w",
        "started_at": repr(clock.wall),
        "lease_expires_at": repr(clock.wall + 10),
        "fencing_token": "1",
        "progress": "0.0",
        "message": "",
    }
    assert await records.running_state("j1") == states[0]
    assert await records.running_states(1) == states[:1]
    records.update("j2", {"lease_expires_at": repr(clock.wall + 100)}, 2)
    clock.advance(10 + LEASE_GRACE * 2)  # j1's lease lapsed: its worker died
    # Still listed, its lease expiry in the past: the monitor reports it as orphaned until
    # another worker takes it over.
    assert [s["job_id"] for s in await records.running_states(100)] == ["j1", "j2"]
    assert await records.running_state("j1") is not None
    assert (await records.running_state("j1"))["lease_expires_at"] == repr(
        clock.wall - 2 * LEASE_GRACE
    )
    assert await records.running_state("j3") is None and await records.running_state("nope") is None


def test_running_state_of_odd_records() -> None:
    now = 1_800_000_000.0
    ok = {"state": "running", "lease_expires_at": repr(now + 1)}
    assert running_state("j", ok, now) is not None
    assert running_state("j", {**ok, "state": "queued"}, now) is None
    for odd in ("", "soon", "nan"):  # shown as it is; aqw status names the damage
        state = running_state("j", {**ok, "lease_expires_at": odd}, now)
        assert state is not None and state["lease_expires_at"] == odd


# -- waiters ---------------------------------------------------------------------------------


async def test_wait_returns_at_once_for_a_finished_job_and_raises_for_an_unknown_one() -> None:
    records = LocalJobRecords("q")
    j = job(1)
    records.enqueued(j)
    ended(records, j)
    assert (await records.wait_finished(j.id, 0.01)).state == "succeeded"
    assert (await records.wait_finished(j.id, None)).state == "succeeded"
    with pytest.raises(aqw.UnknownJob) as caught:
        await records.wait_finished("nope", None)
    assert caught.value.job_id == "nope"
    assert records.waiting() == 0


async def test_every_waiter_on_one_job_is_woken_with_its_end() -> None:
    records = LocalJobRecords("q")
    j, other = job(1), job(2)
    records.enqueued(j)
    records.enqueued(other)
    waiters = [asyncio.create_task(records.wait_finished(j.id, 10)) for _ in range(50)]
    bystander = asyncio.create_task(records.wait_finished(other.id, 10))
    await asyncio.sleep(0.01)
    assert records.waiting(j.id) == 50 and records.waiting() == 51
    records.started(j, "w", 1, time.time() + 30)
    await asyncio.sleep(0.01)
    assert not any(w.done() for w in waiters)
    records.finish(j, "succeeded", {"result": '"ok"'}, 0)  # keep_for 0: gone at once
    infos = await asyncio.gather(*waiters)
    assert {(i.state, i.result) for i in infos} == {("succeeded", "ok")}
    assert records.info(j.id) is None
    assert records.waiting(j.id) == 0 and not bystander.done()
    assert await records.cancel(other.id, 60) == "cancelled"
    assert (await bystander).state == "cancelled"
    assert records.waiting() == 0


async def test_a_waiter_that_times_out_or_is_cancelled_leaves_nothing_behind() -> None:
    records = LocalJobRecords("q")
    j = job(1)
    records.enqueued(j)
    timeout = 0.1
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        await records.wait_finished(j.id, timeout)
    assert time.monotonic() - t0 >= timeout - 0.001  # not before its time
    assert records.waiting() == 0
    task = asyncio.create_task(records.wait_finished(j.id, None))
    await asyncio.sleep(0.01)
    assert records.waiting(j.id) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert records.waiting() == 0 and records._waiters == {}
    ended(records, j)  # nobody left to wake
    assert (await records.wait_finished(j.id, 1)).state == "succeeded"


async def test_a_waiter_whose_record_goes_raises_unknown_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    records = LocalJobRecords("q", limit=1)
    records.enqueued(job(1))
    evicted = asyncio.create_task(records.wait_finished("j1", 10))
    await asyncio.sleep(0.01)
    records.enqueued(job(2))  # past the bound: j1's record is dropped
    with pytest.raises(aqw.UnknownJob):
        await evicted
    cleared = asyncio.create_task(records.wait_finished("j2", 10))
    await asyncio.sleep(0.01)
    records.clear()  # the queue was deleted
    with pytest.raises(aqw.UnknownJob):
        await cleared
    keep = 0.2
    monkeypatch.setattr(lr, "UNFINISHED_KEEP", keep)
    t0 = time.monotonic()
    records.enqueued(job(3))
    with pytest.raises(aqw.UnknownJob):  # its record ended while it waited: no hang
        await asyncio.wait_for(records.wait_finished("j3", None), 30)
    assert time.monotonic() - t0 >= keep - 0.01  # it waited for the record to end
    assert records.waiting() == 0


# -- the start guard -----------------------------------------------------------------------------


async def test_the_start_guard_marks_the_job_running_and_renews_its_expiry() -> None:
    records = LocalJobRecords("q")
    backend = MemoryLeaseBackend()
    j = job(1)
    records.enqueued(j)
    guard = LocalStartGuard(backend, records, j, "w-1")
    fence = await guard.acquire("lease:j1", "t", 1000)
    assert fence is not None
    info = records.info(j.id)
    assert info is not None and (info.state, info.fencing_token, info.worker) == (
        "running",
        fence,
        "w-1",
    )
    assert info.lease_expires_at is not None
    first = info.lease_expires_at
    assert await guard.acquire("lease:j1", "other", 1000) is None  # held: the record stays
    assert (records.info(j.id) or info).fencing_token == fence
    await asyncio.sleep(0.01)
    assert await guard.renew("lease:j1", "t", 60_000) is True
    info = records.info(j.id)
    assert info is not None and info.lease_expires_at is not None
    assert info.lease_expires_at.timestamp() > first.timestamp() + 50
    assert await guard.renew("lease:j1", "wrong", 60_000) is False
    assert await guard.release("lease:j1", "t") is True


async def test_the_start_guard_refuses_a_cancelled_job_and_takes_nothing() -> None:
    records = LocalJobRecords("q")
    backend = MemoryLeaseBackend()
    j = job(1)
    records.enqueued(j)
    assert await records.cancel(j.id, DEFAULT_KEEP_FOR) == "cancelled"
    guard = LocalStartGuard(backend, records, j, "w")
    with pytest.raises(aqw.JobCancelled):
        await guard.acquire("lease:j1", "t", 1000)
    assert backend.owner("lease:j1") is None
    assert state_of(records, j.id) == "cancelled"


async def test_a_cancel_that_lands_during_the_acquire_releases_the_lease() -> None:
    records = LocalJobRecords("q")
    j = job(1)
    records.enqueued(j)

    class Slow(MemoryLeaseBackend):
        async def acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
            fence = await super().acquire(key, token, ttl_ms)
            assert await records.cancel(j.id, 60) == "cancelled"  # while the reply is on its way
            return fence

    backend = Slow()
    with pytest.raises(aqw.JobCancelled):
        await LocalStartGuard(backend, records, j, "w").acquire("lease:j1", "t", 1000)
    assert backend.owner("lease:j1") is None
    assert state_of(records, j.id) == "cancelled"
