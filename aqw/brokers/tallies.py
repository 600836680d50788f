"""Per-task counts and duration histograms, the values of the ``JobRates`` part
(``aqw.brokers.parts``): how long buckets are kept, the histogram's buckets and quantiles,
and ``TaskTally``, one task's finished attempts in one time bucket."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: Seconds the per-minute buckets of ``JobRates`` are kept (the 1 h view, with margin).
MINUTE_KEEP = 2 * 3600
#: Seconds the per-hour buckets of ``JobRates`` are kept (the 7 d view, with margin).
HOUR_KEEP = 8 * 86400
#: The duration histogram: buckets grow by ``GROWTH`` from ``BASE`` seconds; ``BUCKETS``
#: of them reach ~ 8 hours. Each bucket stands for its upper bound (within 20%).
GROWTH = 1.2
BASE = 0.0001
BUCKETS = 100
_LOG_GROWTH = math.log(GROWTH)


def duration_bucket(seconds: float) -> int:
    """The histogram bucket of a duration."""
    if seconds <= BASE:
        return 0
    return min(BUCKETS - 1, 1 + int(math.log(seconds / BASE) / _LOG_GROWTH))


def bucket_upper(index: int) -> float:
    """The upper bound, in seconds, of histogram bucket ``index``."""
    return BASE * GROWTH**index


def quantile(histogram: dict[int, int], q: float) -> float | None:
    """The ``q`` quantile (0-1) of a sparse histogram (bucket -> count), as its bucket's
    upper bound; None when it is empty."""
    total = sum(histogram.values())
    if total <= 0:
        return None
    seen = 0
    for index in sorted(histogram):
        seen += histogram[index]
        if seen >= q * total:
            return bucket_upper(index)
    return bucket_upper(max(histogram))


@dataclass(slots=True)
class TaskTally:
    """One task's finished attempts in one time bucket: counts per outcome (``processed``,
    ``failed``, ``retried``, ``dead``...) and a sparse duration histogram (bucket index of
    ``aqw.worker``'s histogram -> count)."""

    counts: dict[str, int] = field(default_factory=dict)
    durations: dict[int, int] = field(default_factory=dict)

    def merge(self, other: TaskTally) -> None:
        for name, n in other.counts.items():
            self.counts[name] = self.counts.get(name, 0) + n
        for index, n in other.durations.items():
            self.durations[index] = self.durations.get(index, 0) + n
