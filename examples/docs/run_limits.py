"""Limits changed at run time: lower a rate limit while workers run, no restart."""

import asyncio

import aqw

app = aqw.App("memory://", queue="partner")


@app.task(rate_limit="100/s", concurrency_key=lambda p: p, max_per_key=4)
async def call_partner(account: str) -> None: ...


async def main() -> None:
    # the partner API answers 429: lower the limit for every worker of the queue
    await app.limits.set("call_partner", "20/s")
    await app.limits.set("call_partner", max_per_key=2)
    for row in await app.limits.show():
        print(row)
    assert [r["now"] for r in await app.limits.show()] == ["20/s", "2"]

    await app.limits.reset("call_partner")  # back to what the task registered
    assert [r["now"] for r in await app.limits.show()] == ["100/s", "4"]
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
