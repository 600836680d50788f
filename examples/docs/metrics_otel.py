"""Metrics through OpenTelemetry: give the App a MeterProvider (or set the global one).

Here an in-memory reader collects them; in production use an OTLP or Prometheus reader.
Needs the otel extra: pip install -e '.[otel]' from a checkout, or
pip install 'aqw[otel] @ git+https://<your git host>/aqw.git' (aqw is not on a package index yet).
"""

import asyncio

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import aqw

reader = InMemoryMetricReader()
app = aqw.App("memory://", queue="mail", meter_provider=MeterProvider(metric_readers=[reader]))


@app.task
async def send(n: int) -> None:
    if n == 0:
        raise aqw.Reject("no such mailbox")


async def main() -> None:
    await send.enqueue_many([0, 1, 2, 3])
    await app.worker(burst=True).run()

    data = reader.get_metrics_data()
    for metric in data.resource_metrics[0].scope_metrics[0].metrics:
        for point in metric.data.data_points:
            value = getattr(point, "value", None)
            if value is None:
                value = f"count={point.count} sum={point.sum:.4f}"
            print(f"{metric.name:<28} {dict(point.attributes).get('aqw.task', ''):<6} {value}")
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
