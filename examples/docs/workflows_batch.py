"""A batch: 20 images resized, then one report, enqueued exactly once when the last is done."""

import asyncio

from pydantic import BaseModel

import aqw

app = aqw.App("memory://", queue="images")


class Image(BaseModel):
    id: int


class Report(BaseModel):
    day: str


@app.task(keep_result=True, max_retries=0)
async def resize(image: Image) -> int:
    if image.id == 13:
        raise ValueError("corrupt image")
    return image.id * 100


@app.task
async def summarize(report: Report, ctx: aqw.Context) -> None:
    info = ctx.batch  # the counts as they were when the batch completed
    assert info is not None
    print(f"{report.day}: {info.succeeded} resized, {info.failed} failed of {info.total}")


@app.task
async def alert(report: Report, ctx: aqw.Context) -> None:
    assert ctx.batch is not None
    print(f"{report.day}: {ctx.batch.failed} image(s) need a look")


async def main() -> None:
    async with app.batch(
        on_complete=summarize, on_failure=alert, payload=Report(day="2026-12-01")
    ) as batch:
        await batch.enqueue(resize, Image(id=1))
        await batch.enqueue_many(resize, [Image(id=i) for i in range(2, 21)])
    # Leaving the block sealed the batch: only now can it complete.
    async with app.worker(burst=True) as worker:
        await worker.wait_stopped()

    info = await app.batch_info(batch.id)
    assert info is not None
    print(info.state, info.total, info.succeeded, info.failed, sorted(info.callbacks))
    assert (info.state, info.succeeded, info.failed) == ("complete", 19, 1)
    assert sorted(info.callbacks) == ["complete", "failure"]  # no on_success: one failed

    results = await app.batch_results(batch.id, count=5)  # a page of the kept results
    print(sorted(results.values()))
    assert sorted(results.values()) == [100, 200, 300, 400, 500]
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
