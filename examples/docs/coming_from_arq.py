"""A typical arq app ported to aqw with docs/coming-from.md alone: ctx first, Retry(defer=),
max_tries, job_timeout, keep_result, cron_jobs, _job_id, _defer_by, job.status(),
job.result() and job.abort()."""

import asyncio

import aqw

app = aqw.App("memory://downloads", queue="downloads")  # "redis://localhost:6379/0"
SIZES = {"https://example.com/a": 1200, "https://example.com/b": 300}
tries: dict[str, int] = {}


# async def download(ctx, url): ... with max_tries=5, job_timeout=60, keep_result=3600
@app.task(max_retries=4, timeout=60.0, keep_result=True, keep_for=3600.0)
async def download(url: str, ctx: aqw.Context) -> int:
    tries[url] = ctx.attempt  # ctx["job_try"]
    if url.endswith("/a") and ctx.attempt == 1:
        raise aqw.Retry(delay=0.05, reason="503 from the server")  # Retry(defer=...)
    return SIZES[url]


# cron_jobs = [cron(cleanup, hour=3, minute=0)]
@app.task(schedule=aqw.Cron("0 3 * * *"))
async def cleanup() -> None:
    pass


async def main() -> None:
    # await redis.enqueue_job("download", url, _job_id="dl-a"): the id is aqw's, the key is
    # yours; a second enqueue of the key returns the first job's id (duplicate=True)
    first = await download.enqueue("https://example.com/a", key="dl-a")
    again = await download.enqueue("https://example.com/a", key="dl-a")
    assert again == first and again.duplicate
    later = await download.enqueue("https://example.com/b", delay=3600)  # _defer_by=3600
    info = await app.job(later)  # await job.status() / job.info()
    assert info is not None and info.state == "delayed"
    assert await app.cancel(later) == "cancelled"  # await job.abort()
    async with app.worker(concurrency=4):  # `aqw worker downloads:app` in production
        assert await app.result(first, timeout=10) == 1200  # await job.result(timeout=10)
    assert tries == {"https://example.com/a": 2}  # retried once, the cancelled one never ran
    ended = await app.job(later)
    assert ended is not None and ended.state == "cancelled"
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
