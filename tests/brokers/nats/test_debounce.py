"""Debounced enqueue on NATS JetStream (``aqw/brokers/nats/_debounce.py``): the tests every
broker that debounces passes (``tests/test_debounce.py``), run against the real server with
a ``backend`` of this broker (``conftest.NatsBackend``)."""

from __future__ import annotations

import pytest

from tests.test_concurrency_caps import (  # noqa: F401 - collected here, on this broker
    test_a_debounced_job_waits_for_a_started_one_of_its_key,
)
from tests.test_debounce import (  # noqa: F401 - collected here, on this broker
    test_a_burst_runs_once_with_the_last_payload,
    test_a_cancelled_waiting_job_is_not_revived,
    test_a_started_job_is_not_touched,
    test_a_steady_trickle_still_runs_by_first_plus_max,
    test_concurrent_producers_make_one_job_per_burst,
    test_debounce_max_bounds_the_push_back,
    test_debounce_takes_one_payload,
    test_each_enqueue_pushes_the_start_back,
    test_the_next_burst_runs_again,
    test_two_keys_are_independent,
)

pytestmark = pytest.mark.timeout(60)
