"""A flow: fetch, then parse and count side by side, then store what both found."""

import asyncio

from pydantic import BaseModel

import aqw

app = aqw.App("memory://", queue="pages")


class Source(BaseModel):
    url: str


class Page(BaseModel):
    url: str
    text: str


@app.task(keep_result=True)
async def fetch(source: Source) -> Page:
    return Page(url=source.url, text="aqw runs jobs; aqw counts them")


@app.task(keep_result=True)
async def words(page: Page) -> int:  # fetch's result, validated as a Page
    return len(page.text.split())


@app.task(keep_result=True)
async def mentions(page: Page) -> int:
    return page.text.count("aqw")


@app.task(keep_result=True)
async def store(found: dict[str, int]) -> str:  # several parents: step name -> result
    return f"{found['words']} words, {found['mentions']} mentions"


async def main() -> None:
    flow = aqw.Flow()
    page = flow.add(fetch, Source(url="https://example.com/"))
    counted = flow.add(words, after=page)
    named = flow.add(mentions, after=page)
    flow.add(store, after=[counted, named])
    handle = await app.start(flow)

    async with app.worker(burst=True) as worker:
        await worker.wait_stopped()
    result = await handle.result(timeout=10)
    print(result)
    assert result == "6 words, 2 mentions"

    info = await app.flow_info(handle.id)
    assert info is not None
    print({name: step.state for name, step in info.steps.items()})
    assert {step.state for step in info.steps.values()} == {"succeeded"}
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
