"""The meter's instruments, made once per meter provider: histograms, and observable counters
and gauges read when the SDK collects."""

from __future__ import annotations

import threading
import weakref
from array import array
from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry import metrics
from opentelemetry.context import Context, create_key, set_value
from opentelemetry.metrics import CallbackOptions, Observation

from ._names import METRICS

#: A source of gauge readings: returns (metric name, value, attributes) tuples.
GaugeSource = Callable[[], list[tuple[str, float, dict[str, Any]]]]

#: Histogram values kept per (metric, queue, task) before they are handed to the SDK: when
#: a key has this many, the caller records them at once (about 7 us a value: a pause under
#: a millisecond), which bounds both the memory kept and the pause.
MAX_PENDING = 128

#: Batched values are recorded outside any span: no exemplars from a job's trace. Not an
#: empty ``Context``: the SDK takes a falsy one for "none given" and reads the current one.
_NO_CONTEXT = set_value(create_key("aqw.batched"), True, Context())

Pending = dict[tuple[str, str, str], tuple["array[float]", dict[str, Any]]]


class Instruments:
    """The meter's instruments, made once per meter provider.

    Counters are observable counters over totals kept here: counting a job is a dict
    update, and the SDK reads the totals when it collects, instead of aggregating every
    increment as it happens (several microseconds each, per job).

    Histogram values are kept here too, per (metric, queue, task): a job appends two floats
    to an array. They are recorded into the SDK's histograms, each exactly once, outside any
    span (no exemplar lookups) when a key has ``MAX_PENDING`` of them, when the SDK collects
    (the first observable callback of a collection flushes them, before the SDK reads its
    aggregations) and when a worker stops (``flush``). The SDK's own cost per value (about
    7 us, in its attribute handling) is paid then, in a sub-millisecond batch, not avoided:
    the OpenTelemetry API has no way to hand a histogram values in bulk."""

    def __init__(self, meter: metrics.Meter) -> None:
        self.meter = meter
        self.totals: dict[tuple[str, str, str], list[Any]] = {}
        self.histograms: dict[str, metrics.Histogram] = {}
        self.pending: Pending = {}
        self._lock = threading.Lock()  # pending is swapped by the collecting thread
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

    def observe(self, key: tuple[str, str, str], value: float, attributes: dict[str, Any]) -> None:
        """Keep ``value`` for histogram ``key[0]`` until the next flush."""
        with self._lock:
            entry = self.pending.get(key)
            if entry is None:
                entry = self.pending[key] = (array("d"), attributes)
            values = entry[0]
            values.append(value)
            if len(values) < MAX_PENDING:
                return
            del self.pending[key]
        self._record({key: entry})

    def flush(self) -> None:
        """Record every kept histogram value in the SDK's histograms."""
        if not self.pending:
            return
        with self._lock:
            pending, self.pending = self.pending, {}
        self._record(pending)

    def _record(self, pending: Pending) -> None:
        for (name, _, _), (values, attributes) in pending.items():
            record = self.histograms[name].record
            for value in values:
                record(value, attributes, context=_NO_CONTEXT)

    def _totals(self, name: str) -> Callable[[CallbackOptions], Iterator[Observation]]:
        def observe(options: CallbackOptions) -> Iterator[Observation]:
            self.flush()
            for (metric, _, _), (value, attributes) in list(self.totals.items()):
                if metric == name:
                    yield Observation(value, attributes)

        return observe

    def _observer(self, name: str) -> Callable[[CallbackOptions], Iterator[Observation]]:
        def observe(options: CallbackOptions) -> Iterator[Observation]:
            self.flush()
            for source in list(self.gauge_sources):
                for metric, value, attributes in source():
                    if metric == name:
                        yield Observation(value, attributes)

        return observe


#: Instruments per meter provider, forgotten with the provider (an ``id()`` could be reused).
INSTRUMENTS: weakref.WeakKeyDictionary[Any, Instruments] = weakref.WeakKeyDictionary()
