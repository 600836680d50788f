"""aqw.Monitor: the alert rules evaluated live, with transitions sent to sinks."""

import asyncio
import logging

import aqw
from aqw.monitor import Alert, CallbackSink, Monitor

logging.basicConfig(level=logging.CRITICAL)  # keep this demo's output short
app = aqw.App("memory://", queue="exports", retry=aqw.RetryPolicy(base=0.01, cap=0.01))
events: list[str] = []
stuck_resolved = asyncio.Event()


@app.task(sla=0.2)  # expected to take 0.2 s: reported stuck past 2 x 0.2 s
async def export(n: int) -> None:
    await asyncio.sleep(1.5)


@app.task
async def flaky(n: int, ctx: aqw.Context) -> None:
    if ctx.attempt == 1:
        raise ConnectionError("upstream reset")


def on_alert(alert: Alert) -> None:
    state = "FIRING" if alert.active else "RESOLVED"
    events.append(f"{state} {alert.rule}")
    print(f"{state:<8} {alert.key}: {alert.summary}")
    if state == "RESOLVED" and alert.rule == "stuck_job":
        stuck_resolved.set()  # the job finished


async def main() -> None:
    monitor = Monitor(
        app,
        sinks=[CallbackSink(on_alert)],  # also: LogSink(), WebhookSink("https://...")
        interval=0.2,
        min_processed=10,  # the retry rule needs this many settled jobs in its window
    )
    # A worker publishes its heartbeat (counts, stuck jobs) every `heartbeat` seconds;
    # the monitor reads heartbeats, so the short interval here is for the demo only.
    async with aqw.Worker(app, concurrency=20, heartbeat=0.2), monitor:
        await export.enqueue(1)
        await flaky.enqueue_many(range(10))
        await stuck_resolved.wait()
    assert "FIRING retry_rate" in events and "FIRING stuck_job" in events
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
