"""Retries: exponential backoff with full jitter, a bound, and errors that never retry."""

import asyncio

import aqw

policy = aqw.RetryPolicy(max_retries=3, base=0.01, cap=0.05, no_retry=(PermissionError,))
app = aqw.App("memory://", queue="sync", retry=policy)


@app.task
async def flaky(n: int, ctx: aqw.Context) -> None:
    if ctx.attempt < 3:
        raise ConnectionError(f"upstream timed out (attempt {ctx.attempt})")  # retried


@app.task
async def rate_limited(n: int, ctx: aqw.Context) -> None:
    if ctx.attempt == 1:
        raise aqw.Retry(delay=0.02, reason="429 from the API")  # my delay, still counted


@app.task
async def forbidden(n: int) -> None:
    raise PermissionError("token revoked")  # in no_retry: dead-lettered at once


@app.task(max_retries=1)
async def bad_row(n: int) -> None:
    raise aqw.Reject(f"row {n} can never be imported")  # straight to the DLQ


async def main() -> None:
    # The delay after the n-th failed run is drawn from [0, min(cap, base * 2**(n-1))].
    print("ceilings:", [policy.ceiling(n) for n in (1, 2, 3, 4)])

    for task in (flaky, rate_limited, forbidden, bad_row):
        await task.enqueue(1)
    worker = app.worker(burst=True)
    await worker.run()
    s = worker.stats
    print(f"succeeded={s.processed} retried={s.retried} dead={s.dead} failed attempts={s.failed}")
    assert (s.processed, s.retried, s.dead) == (2, 3, 2)

    for error in worker.errors.top(5):  # error fingerprints: type + where, counted
        print(f"  {error.fingerprint} x{error.count} {error.task}: {error.error_type}")
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
