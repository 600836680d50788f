"""The meter's instruments, made once per meter provider: histograms, and observable counters
and gauges read when the SDK collects."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from ._names import METRICS

#: A source of gauge readings: returns (metric name, value, attributes) tuples.
GaugeSource = Callable[[], list[tuple[str, float, dict[str, Any]]]]


class Instruments:
    """The meter's instruments, made once per meter provider.

    Counters are observable counters over totals kept here: counting a job is a dict
    update, and the SDK reads the totals when it collects, instead of aggregating every
    increment as it happens (several microseconds each, per job)."""

    def __init__(self, meter: metrics.Meter) -> None:
        self.meter = meter
        self.totals: dict[tuple[str, str, str], list[Any]] = {}
        self.histograms: dict[str, metrics.Histogram] = {}
        self.gauge_sources: list[GaugeSource] = []
        for name, (kind, unit, description) in METRICS.items():
            if kind == "counter":
                meter.create_observable_counter(
                    name, [self._totals(name)], unit=unit, description=description
                )
            elif kind == "histogram":
                self.histograms[name] = meter.create_histogram(name, unit, description)
            else:
                meter.create_observable_gauge(
                    name, [self._observer(name)], unit=unit, description=description
                )

    def _totals(self, name: str) -> Callable[[CallbackOptions], Iterator[Observation]]:
        def observe(options: CallbackOptions) -> Iterator[Observation]:
            for (metric, _, _), (value, attributes) in list(self.totals.items()):
                if metric == name:
                    yield Observation(value, attributes)

        return observe

    def _observer(self, name: str) -> Callable[[CallbackOptions], Iterator[Observation]]:
        def observe(options: CallbackOptions) -> Iterator[Observation]:
            for source in list(self.gauge_sources):
                for metric, value, attributes in source():
                    if metric == name:
                        yield Observation(value, attributes)

        return observe


#: Instruments per meter provider, forgotten with the provider (an ``id()`` could be reused).
INSTRUMENTS: weakref.WeakKeyDictionary[Any, Instruments] = weakref.WeakKeyDictionary()
