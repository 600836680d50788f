"""A batch as a step of a flow: fetch, then one resize child per image, then a summary of
every child's result, started once the last child is final."""

import asyncio

from pydantic import BaseModel

import aqw

app = aqw.App("memory://", queue="images")


class Image(BaseModel):
    id: int


@app.task(keep_result=True)
async def fetch() -> str:
    return "album-7"


@app.task(keep_result=True)
async def resize(image: Image) -> int:
    return image.id * 100  # the thumbnail's size


@app.task(keep_result=True)
async def summarize(sizes: list[int]) -> str:  # every child's result, in payload order
    return f"{len(sizes)} thumbnails, {sum(sizes)} bytes"


async def main() -> None:
    flow = aqw.Flow()
    album = flow.add(fetch)
    sized = flow.batch(resize, [Image(id=i) for i in range(1, 11)], after=album)
    flow.add(summarize, after=sized)
    handle = await app.start(flow)

    async with app.worker(burst=True) as worker:
        await worker.wait_stopped()
    result = await handle.result(timeout=10)
    print(result)
    assert result == "10 thumbnails, 5500 bytes"

    info = await app.flow_info(handle.id)
    assert info is not None
    batch = await app.batch_info(info.steps["resize"].job_id)  # the step is a batch
    assert batch is not None
    print(f"resize: {batch.succeeded}/{batch.total} succeeded")
    assert (batch.succeeded, batch.total) == (10, 10)
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
