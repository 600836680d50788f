"""A job's record and its result: read the state at any time, wait for the result."""

import asyncio

from pydantic import BaseModel

import aqw

app = aqw.App("memory://", queue="images", keep_for=3600)  # records live an hour once done


class Image(BaseModel):
    url: str


class Thumbnail(BaseModel):
    url: str
    width: int


@app.task(keep_result=True)  # the return value is kept as JSON in the job's record
async def resize(image: Image) -> Thumbnail:
    return Thumbnail(url=image.url + "?w=128", width=128)


@app.task(max_retries=0)
async def broken() -> None:
    raise ValueError("the source is gone")


async def main() -> None:
    job_id = await resize.enqueue(Image(url="https://example.com/a.png"))
    info = await app.job(job_id)
    assert info is not None
    print("before:", info.state)  # queued
    failing = await broken.enqueue()

    async with app.worker(concurrency=4):
        thumb = await app.result(job_id, timeout=10)  # waits without polling
        print("result:", thumb)  # a Thumbnail, validated against the return annotation
        try:
            await app.result(failing, timeout=10)
        except aqw.JobFailed as exc:
            print("failed:", exc.error)  # ValueError: the source is gone

    info = await app.job(failing)
    assert info is not None and info.error is not None
    print("after:", info.state, info.error.type, "DLQ entry", info.dlq_entry)  # dead
    print("unknown id:", await app.job("no-such-job"))  # None
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
