"""A typical Celery app ported to aqw with docs/coming-from.md alone: autoretry_for, a rate
limit, a beat crontab, result.get() and a chain."""

import asyncio
import time

import aqw

app = aqw.App("memory://shop", queue="shop")  # "redis://localhost:6379/0" in production
PRICES = {"sku-1": 10.0, "sku-2": 40.0}
sent: list[str] = []
calls: dict[str, int] = {}


async def price_api(sku: str) -> float:
    """Stands in for an HTTP call that fails once with a connection error."""
    calls[sku] = calls.get(sku, 0) + 1
    if calls[sku] == 1:
        raise ConnectionError("prices.example hung up")
    return PRICES[sku]


# autoretry_for=(ConnectionError,), retry_backoff=True, max_retries=5; a result backend
@app.task(retry_on=(ConnectionError,), max_retries=5, keep_result=True)
async def fetch_price(sku: str) -> float:
    return await price_api(sku)


# rate_limit="10/m": in aqw one limit for every worker together, not one per worker
@app.task(rate_limit="10/m")
async def notify(email: str, text: str) -> None:
    sent.append(f"{email}: {text}")


# chain(quote.s(sku, email), notify.s()): an aqw.Flow, where notify's input is quote's
# result, enqueued once when quote succeeds (docs/concepts/workflows.md).
@app.task(retry_on=(ConnectionError,), max_retries=5, keep_result=True)
async def quote(sku: str, email: str) -> dict[str, str]:
    price = await price_api(sku) * 0.9
    return {"email": email, "text": f"{sku} at {price:.2f}"}


# beat_schedule = {"nightly": {"task": "...", "schedule": crontab(hour=3, minute=0)}}
@app.task(schedule=aqw.Cron("0 3 * * *", tz="Europe/Paris"))
async def nightly_report() -> None:
    pass


async def main() -> None:
    async with app.worker(concurrency=8):  # `aqw worker shop:app` in production
        job_id = await fetch_price.enqueue("sku-1")  # fetch_price.delay("sku-1")
        price = await app.result(job_id, timeout=10)  # result.get(timeout=10)
        assert price == 10.0 and calls["sku-1"] == 2  # retried once, then succeeded
        chain = aqw.Flow()
        chain.add(notify, after=chain.add(quote, {"sku": "sku-2", "email": "ada@example.com"}))
        handle = await app.start(chain)
        await handle.result(timeout=10)
    assert sent == ["ada@example.com: sku-2 at 36.00"]
    schedule = nightly_report.options.schedule
    assert schedule is not None and schedule.next_after(time.time()) > time.time()
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
