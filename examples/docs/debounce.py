"""Debounce: a burst of enqueues for one key runs the job once, with the last payload."""

import asyncio

import aqw

app = aqw.App("memory://", queue="search")
indexed: list[str] = []


@app.task(keep_result=True)
async def reindex(text: str) -> str:
    indexed.append(text)
    return text


async def main() -> None:
    # A user types: each keystroke enqueues, and only the last text is indexed, 0.2 s after
    # the typing stops (and no later than 2 s after the first keystroke).
    typed = ["h", "he", "hel", "hell", "hello"]
    got = [await reindex.enqueue(t, key="doc:7", debounce=0.2, debounce_max=2.0) for t in typed]
    print([(str(e)[:8], e.duplicate) for e in got])
    assert len(set(got)) == 1 and [e.duplicate for e in got] == [False] + [True] * 4

    info = await app.job(got[0])
    assert info is not None
    print("state:", info.state, "run_at:", info.run_at)

    async with app.worker():
        print("result:", await app.result(got[0], timeout=10))
    assert indexed == ["hello"]

    # The next burst is a new job: a debounce key is not an idempotency key.
    again = await reindex.enqueue("hello world", key="doc:7", debounce=0.2)
    assert again != got[0] and not again.duplicate
    async with app.worker():
        await app.result(again, timeout=10)
    assert indexed == ["hello", "hello world"]
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
