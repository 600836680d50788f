"""Rate limits and per-key caps on NATS JetStream: the tests every broker that enforces them
passes (``tests/test_rate_limits.py``, ``tests/test_concurrency_caps.py``; the debounced
one is in ``test_debounce.py``), run against the real server with a ``backend`` of
this broker (``conftest.NatsBackend``)."""

from __future__ import annotations

import pytest

from tests.test_concurrency_caps import (  # noqa: F401 - collected here, on this broker
    test_a_cap_of_one_runs_one_job_of_a_key_at_a_time,
    test_a_cap_of_two,
    test_a_long_job_keeps_its_slot_through_renewals,
    test_a_waiting_job_reads_delayed,
    test_waiting_jobs_hold_no_worker_slot,
)
from tests.test_rate_limits import (  # noqa: F401 - collected here, on this broker
    test_a_handlers_rate_limited_puts_the_job_off_without_spending_an_attempt,
    test_a_job_over_the_limit_reads_delayed_with_its_turn,
    test_one_bucket_per_rate_key,
    test_rate_limit_deferrals_are_counted_with_their_reason,
    test_starts_are_spaced_by_the_rate_limit_across_two_workers,
)

pytestmark = pytest.mark.timeout(60)
