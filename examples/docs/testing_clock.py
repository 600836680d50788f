"""Time without waiting: aqw.testing.MockClock on memory://. A job delayed an hour and a job
retried with minute-long backoffs run at once, in the order real time would run them."""

import asyncio
import logging

import aqw
from aqw.testing import MockClock, use_memory

logging.basicConfig(level=logging.CRITICAL)  # the flaky job below logs its retries
app = aqw.App("memory://", queue="reports", retry=aqw.RetryPolicy(base=60.0, jitter=False))
tries: list[int] = []


@app.task(keep_result=True)
async def nightly(day: str) -> str:
    return f"report for {day}"


@app.task(max_retries=3, keep_result=True)
async def fetch(url: str) -> str:
    tries.append(len(tries) + 1)
    if len(tries) < 3:
        raise ConnectionError("upstream down")  # retried after 60 s, then 120 s
    return url


async def test_an_hour_and_some_retries_pass_at_once() -> None:
    with use_memory(app):
        async with MockClock() as clock:
            start = clock.monotonic()
            report = await nightly.enqueue("2024-05-01", delay=3600)
            page = await fetch.enqueue("https://example.com")
            async with app.worker():
                assert await app.result(page, timeout=600) == "https://example.com"
                assert await app.result(report, timeout=7200) == "report for 2024-05-01"
            assert tries == [1, 2, 3]
            assert clock.monotonic() - start >= 3600  # an hour of the test's time passed


if __name__ == "__main__":
    asyncio.run(test_an_hour_and_some_retries_pass_at_once())
    print("ok")
