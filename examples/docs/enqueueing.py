"""The ways to enqueue: now, later, at a time, once per key, many at once."""

import asyncio
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, ValidationError

import aqw

app = aqw.App("memory://", queue="mail")


class Mail(BaseModel):
    to: str


@app.task
async def send(mail: Mail) -> None: ...


async def main() -> None:
    now = await send.enqueue(Mail(to="ada@example.com"))  # a model, or anything that
    dict_too = await send.enqueue({"to": "grace@example.com"})  # validates into one
    later = await send.enqueue(Mail(to="alan@example.com"), delay=30.0)  # in 30 s
    at = await send.enqueue(
        Mail(to="edsger@example.com"), at=datetime.now(UTC) + timedelta(hours=1)
    )  # at a time
    once = await send.enqueue(Mail(to="barbara@example.com"), key="welcome:barbara")
    again = await send.enqueue(Mail(to="barbara@example.com"), key="welcome:barbara")
    many = await send.enqueue_many([Mail(to=f"user{i}@example.com") for i in range(3)])
    traced = await send.enqueue(Mail(to="ken@example.com"), headers={"tenant": "acme"})
    print(now, dict_too, later, at, once, again.duplicate, many, traced, sep="\n")

    try:
        await send.enqueue({"to": 7})  # validated here: nothing is written
    except ValidationError as exc:
        print(type(exc).__name__, "-", exc.errors()[0]["msg"])

    depth = await app.broker.depth()
    print(depth)
    assert (depth.waiting, depth.delayed) == (7, 2) and again == once
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
