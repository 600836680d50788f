"""Debounced enqueue on the PostgreSQL broker (``aqw_debounce_publish``), against the real
PostgreSQL: the debounce tests of every broker (``tests/test_debounce.py``) run here on a
fresh schema, each of their apps a broker with a pool of its own (the concurrent producers
are three of them), and the wire form keeps the waiting job's id whatever its characters."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import aqw
from aqw.flow import DEBOUNCE_HEADER
from tests import test_debounce as shared
from tests.pg_broker._backend import PgBackend, backend

__all__ = ["backend"]  # the fixture

pytestmark = pytest.mark.timeout(60)


SHARED: list[Callable[[Any], Awaitable[None]]] = [
    shared.test_a_burst_runs_once_with_the_last_payload,
    shared.test_each_enqueue_pushes_the_start_back,
    shared.test_debounce_max_bounds_the_push_back,
    shared.test_a_steady_trickle_still_runs_by_first_plus_max,
    shared.test_two_keys_are_independent,
    shared.test_the_next_burst_runs_again,
    shared.test_a_burst_waits_in_its_priority_levels_delayed_set,
    shared.test_a_started_job_is_not_touched,
    shared.test_a_cancelled_waiting_job_is_not_revived,
    shared.test_concurrent_producers_make_one_job_per_burst,
    shared.test_debounce_takes_one_payload,
]


@pytest.mark.parametrize("case", SHARED, ids=[c.__name__.removeprefix("test_") for c in SHARED])
async def test_debounce(case: Callable[[Any], Awaitable[None]], backend: PgBackend) -> None:
    await case(backend)


async def test_the_replaced_form_keeps_an_id_with_escaped_characters(backend: PgBackend) -> None:
    b = backend.app().broker
    odd = 'id "quoted" \\ é'

    def burst(n: int, **extra: Any) -> aqw.Job:
        headers = {DEBOUNCE_HEADER: "1"}
        return aqw.Job(task="sync", payload={"n": n}, key="k", headers=headers, **extra)

    assert b.debounce is not None
    assert await b.debounce.publish(burst(1, id=odd), 0.05, None) == (odd, False)
    assert await b.debounce.publish(burst(2), 0.05, None) == (odd, True)
    await b.start_consuming("c1")
    deliveries = await b.fetch(10, 10.0)
    assert len(deliveries) == 1
    got = aqw.Job.decode(deliveries[0].data)
    assert (got.id, got.payload) == (odd, {"n": 2})
