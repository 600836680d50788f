"""Debounce on NATS when the promoter fails between marking a key's job moved and publishing
it (a fault hook: the publish raises once, as a killed promoter would never send it): the
job still reaches the queue exactly once, from the timer's redelivery (the promoter's
AckWait), or at once from the next burst's first enqueue of the key."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from aqw.brokers.nats._debounce import KvDebounce
from aqw.flow import DEBOUNCE_HEADER
from aqw.job import Job

from .conftest import broker

pytestmark = pytest.mark.timeout(90)


def _burst(n: int) -> Job:
    return Job(task="work", payload={"n": n}, key="user-7", headers={DEBOUNCE_HEADER: "1"})


def _fail_first_move(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    failed: list[str] = []
    move = KvDebounce._move

    async def flaky(self: KvDebounce, js: Any, held: Any) -> None:
        if not failed:
            failed.append(held.job_id)
            raise ConnectionError("the promoter died before its publish")
        await move(self, js, held)

    monkeypatch.setattr(KvDebounce, "_move", flaky)
    return failed


async def _promote_until_queued(b: Any, within: float) -> list[Job]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(ConnectionError):  # the injected fault
            await b.promote_due()
        got = await b.fetch(10, 0.1)
        if got:
            return [Job.decode(d.data) for d in got]
        await asyncio.sleep(0.05)
    return []


async def test_the_timer_comes_back_and_moves_the_job(
    nats_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed = _fail_first_move(monkeypatch)
    b = broker(nats_queue, ack_wait=30.0)
    try:
        assert b.debounce is not None
        first = _burst(1)
        assert await b.debounce.publish(first, 0.2, None) == (first.id, False)
        got = await _promote_until_queued(b, 30)  # the promoter's AckWait is 5 s
        assert failed == [first.id]
        assert [(j.id, j.payload) for j in got] == [(first.id, {"n": 1})]
        await asyncio.sleep(0.3)
        assert await _promote_until_queued(b, 1.0) == []  # once
    finally:
        await b.close()


async def test_the_next_burst_publishes_the_moved_job_first(
    nats_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed = _fail_first_move(monkeypatch)
    b = broker(nats_queue, ack_wait=30.0)
    try:
        assert b.debounce is not None
        first = _burst(1)
        await b.debounce.publish(first, 0.2, None)
        deadline = time.monotonic() + 30
        while not failed:  # the pass that marks it moved and then fails
            assert time.monotonic() < deadline
            with contextlib.suppress(ConnectionError):
                await b.promote_due()
            await asyncio.sleep(0.05)
        second = _burst(2)
        assert await b.debounce.publish(second, 60, None) == (second.id, False)
        got = [Job.decode(d.data) for d in await b.fetch(10, 5)]
        assert [(j.id, j.payload) for j in got] == [(first.id, {"n": 1})]
    finally:
        await b.close()
