"""A worker inside a FastAPI app, next to a lifespan of your own (a database pool here)."""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
from asgi_lifespan import LifespanManager
from fastapi import FastAPI, Request

import aqw
from aqw.fastapi import health, lifespan, worker_of

jobs = aqw.App("memory://", queue="docs-web")  # redis://... in production


@jobs.task
async def resize(image_id: int) -> None:
    await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def db_pool(api: FastAPI) -> AsyncIterator[None]:
    api.state.db = "a connection pool"  # open your pool here, close it after the yield
    yield


@contextlib.asynccontextmanager
async def both(api: FastAPI) -> AsyncIterator[None]:
    async with db_pool(api), lifespan(jobs, concurrency=16, grace=30.0)(api):
        yield


api = FastAPI(lifespan=both)


@api.post("/images/{image_id}/resize", status_code=202)
async def request_resize(image_id: int) -> dict[str, str]:
    return {"job_id": await resize.enqueue(image_id)}


@api.get("/health")
async def get_health(request: Request) -> dict[str, Any]:
    return health(worker_of(request.app))


async def main() -> None:
    async with LifespanManager(api) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            print((await client.post("/images/7/resize")).json())
            for _ in range(100):
                report = (await client.get("/health")).json()
                if report["processed"] == 1:
                    break
                await asyncio.sleep(0.02)
            print(report)
            assert report["ok"] and report["processed"] == 1


if __name__ == "__main__":
    asyncio.run(main())
