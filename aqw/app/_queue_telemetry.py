"""The telemetry of each queue an app produces to or consumes from, following the configured
(or the global) OpenTelemetry providers."""

from __future__ import annotations

from opentelemetry import metrics, trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from ..telemetry import TRACE_DETAILS, Telemetry


class QueueTelemetry:
    """One ``Telemetry`` per queue (its ``messaging.destination.name``), built on first use
    and built again when the global providers change (a test or an SDK set up later)."""

    def __init__(
        self,
        tracer_provider: TracerProvider | None,
        meter_provider: MeterProvider | None,
        *,
        link: bool,
        detail: str,
        redact: bool,
    ) -> None:
        if detail not in TRACE_DETAILS:
            raise ValueError(f"trace_detail must be one of {TRACE_DETAILS}, not {detail!r}")
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._link = link
        self._detail = detail
        self._redact = redact
        self._by_queue: dict[str, Telemetry] = {}
        self._providers: tuple[int, int] = (0, 0)

    def reset(self) -> None:
        """Forget every queue's telemetry (the app moved to another broker)."""
        self._by_queue = {}

    def of(self, queue: str, system: str) -> Telemetry:
        """The telemetry of ``queue`` on a broker of ``messaging.system`` ``system``."""
        tp = self._tracer_provider or trace.get_tracer_provider()
        mp = self._meter_provider or metrics.get_meter_provider()
        providers = (id(tp), id(mp))
        if providers != self._providers:
            self._by_queue, self._providers = {}, providers
        tel = self._by_queue.get(queue)
        if tel is None:
            tel = self._by_queue[queue] = Telemetry(
                queue,
                system,
                tracer_provider=tp,
                meter_provider=mp,
                link=self._link,
                detail=self._detail,
                redact=self._redact,
            )
        return tel
