"""Listing a bucket's keys (``entries``): against the real server, and with a watch whose
end marker never comes (nats-py loses an update delivered before its watch is set up when
the set-up outlasts its timeout, as on a loaded machine)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import nats
import nats.errors
import pytest

from aqw.brokers.messages import Finish
from aqw.brokers.nats import _records, _state
from aqw.errors import UnknownJob
from aqw.job import Job
from aqw.lease import Lease

from .conftest import URL as NATS_URL
from .conftest import broker

pytestmark = pytest.mark.asyncio


async def test_entries_lists_live_keys_and_leaves_out_deleted_ones() -> None:
    nc = await nats.connect(NATS_URL)
    js = nc.jetstream()
    bucket = f"aqw_test_watch_{uuid.uuid4().hex[:8]}"
    kv = await js.create_key_value(bucket=bucket)
    try:
        assert await _state.entries(kv, "job") == []
        await kv.put("job.a", b"1")
        await kv.put("job.b", b"2")
        await kv.put("other.c", b"3")
        await kv.put("job.a", b"4")
        await kv.delete("job.b")
        assert await _state.entries(kv, "job") == [("job.a", b"4")]
    finally:
        await js.delete_key_value(bucket)
        await nc.close()


class _Watcher:
    def __init__(self, updates: list[Any]) -> None:
        self._updates = updates
        self.stopped = False

    async def updates(self, timeout: float = 5.0) -> Any:
        if not self._updates:
            raise nats.errors.TimeoutError
        return self._updates.pop(0)

    async def stop(self) -> None:
        self.stopped = True


class _Entry:
    def __init__(self, key: str, value: bytes, delta: int, operation: str | None = None):
        self.key, self.value, self.delta, self.operation = key, value, delta, operation


class _Kv:
    """A bucket whose first watch loses its last update (no end marker, no delta 0)."""

    def __init__(self) -> None:
        self.watchers: list[_Watcher] = []

    async def watch(self, keys: str, **kwargs: Any) -> _Watcher:
        if not self.watchers:
            w = _Watcher([_Entry("job.a", b"1", 1)])  # job.b's update never comes
        else:
            w = _Watcher([_Entry("job.a", b"1", 1), _Entry("job.b", b"2", 0)])
        self.watchers.append(w)
        return w


async def test_a_watch_that_never_ends_is_started_again() -> None:
    kv = _Kv()
    assert await _state.entries(kv, "job") == [("job.a", b"1"), ("job.b", b"2")]  # type: ignore[arg-type]
    assert len(kv.watchers) == 2 and all(w.stopped for w in kv.watchers)


async def test_a_watch_that_never_ends_again_and_again_raises() -> None:
    class Stuck(_Kv):
        async def watch(self, keys: str, **kwargs: Any) -> _Watcher:
            w = _Watcher([_Entry("job.a", b"1", 1)])
            self.watchers.append(w)
            return w

    kv = Stuck()
    with pytest.raises(nats.errors.TimeoutError):
        await _state.entries(kv, "job")  # type: ignore[arg-type]
    assert len(kv.watchers) == _state.WATCH_TRIES


async def test_a_waiter_whose_watch_stays_silent_reads_the_record(
    nats_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter's watch that never brings the record (its first values lost) still ends:
    the record is read whenever the watch has been quiet ``WATCH_QUIET`` seconds."""
    monkeypatch.setattr(_records, "WATCH_QUIET", 0.1)
    b = broker(nats_queue, ack_wait=30.0)
    try:
        sent = Job(task="work", payload={"n": 1})
        await b.publish([sent])
        kv = await b._records._open()

        async def silent(keys: str, **kwargs: Any) -> _Watcher:
            return _Watcher([])

        monkeypatch.setattr(kv, "watch", silent)
        with pytest.raises(UnknownJob):
            await b.records.wait_finished("no-such-job", 5)
        waiter = asyncio.create_task(b.records.wait_finished(sent.id, 10))
        await b.start_consuming("c1")
        [d] = await b.fetch(1, 5.0)
        got = Job.decode(d.data)
        lease = Lease(b.job_lease_backend(got, None, d), b.job_lease_key(got), ttl=30)
        await lease.acquire()
        await asyncio.sleep(0.3)
        assert not waiter.done()  # running is not an end
        assert await b.ack(d, got, lease, 0.0, Finish("succeeded", 60, result="7")) is True
        async with asyncio.timeout(5):
            info = await waiter
        assert (info.id, info.state, info.result) == (sent.id, "succeeded", 7)
    finally:
        await b.close()
