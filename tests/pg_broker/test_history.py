"""The depth history and delayed page on the PostgreSQL broker (``aqw_depth``), against the
real PostgreSQL: the dashboard's tests of every broker (``tests/test_dashboard.py``) run
here: one sample per bucket whatever the workers, trimmed past ``DEPTH_KEEP``, every
priority level counted, the delayed page soonest first, and workers writing samples with
their heartbeats that the dashboard's overview charts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests import test_dashboard as shared
from tests.pg_broker._backend import PgBackend, backend

__all__ = ["backend"]  # the fixture

pytestmark = pytest.mark.timeout(60)

SHARED: list[Callable[[Any], Awaitable[None]]] = [
    shared.test_depth_history_one_sample_per_bucket_whatever_the_workers,
    shared.test_a_depth_sample_counts_every_priority_level,
    shared.test_the_delayed_page_merges_every_priority_level,
    shared.test_workers_write_depth_samples_with_their_heartbeat,
]


@pytest.mark.parametrize("case", SHARED, ids=[c.__name__.removeprefix("test_") for c in SHARED])
async def test_history(case: Callable[[Any], Awaitable[None]], backend: PgBackend) -> None:
    await case(backend)
