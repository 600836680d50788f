"""Mount the dashboard in a FastAPI app: it needs no lifespan of its own (mounted apps get
none) and connects the App's broker on its first request."""

import asyncio

import httpx
from fastapi import FastAPI
from pydantic import BaseModel

import aqw
from aqw.dashboard import create_app

jobs = aqw.App("memory://", queue="dashboard-docs")


class Invoice(BaseModel):
    number: str


@jobs.task
async def send_invoice(data: Invoice) -> None:
    raise RuntimeError(f"mail server down for {data.number}")  # to fill the dead letters


api = FastAPI()
api.mount("/aqw", create_app(jobs, trace_url="https://tempo.example/trace/{trace_id}"))


async def main() -> None:
    await jobs.enqueue(send_invoice, [Invoice(number="A-1")], delay=60)
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://web") as client:
        for path in ("/aqw/", "/aqw/delayed", "/aqw/dlq", "/aqw/workers"):
            page = await client.get(path)
            print(path, page.status_code)  # /aqw/ 200 ...
        assert "send_invoice" in (await client.get("/aqw/delayed")).text


asyncio.run(main())
