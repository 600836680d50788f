"""Priorities within a queue: levels 0-9, higher first, first in first out within a level."""

import asyncio

import aqw

app = aqw.App("memory://", queue="mail")
sent: list[str] = []


@app.task(priority=9)  # this task's default level
async def password_reset(user: str) -> None:
    sent.append(f"reset:{user}")


@app.task  # level 0, the default
async def newsletter(user: str) -> None:
    sent.append(f"news:{user}")


async def main() -> None:
    await newsletter.enqueue_many(["ann", "bob", "cy"])
    await newsletter.enqueue("vip", priority=5)  # an enqueue may name its own level
    await password_reset.enqueue("dee")
    await app.enqueue("password_reset", ["eve"])  # by name: the task's level, 9

    # One slot and strict order (priority_share=0): the levels drain highest first.
    await app.worker(concurrency=1, burst=True, priority_share=0).run()
    print(sent)
    assert sent == ["reset:dee", "reset:eve", "news:vip", "news:ann", "news:bob", "news:cy"]

    try:
        await newsletter.enqueue("zed", priority=10)
    except aqw.ConfigError as exc:
        print("refused:", exc)
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
