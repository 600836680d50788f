"""Listing a bucket's keys (``entries``): against the real server, and with a watch whose
end marker never comes (nats-py loses an update delivered before its watch is set up when
the set-up outlasts its timeout, as on a loaded machine)."""

from __future__ import annotations

import uuid
from typing import Any

import nats
import nats.errors
import pytest

from aqw.brokers.nats import _state

from .conftest import URL as NATS_URL

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
