"""A worker process on the PostgreSQL broker for the shared-records test:

    python pg_records_proc.py URL

``double`` keeps its result (n * 2); ``hang`` runs until it is cancelled."""

from __future__ import annotations

import asyncio
import sys

import aqw


async def main(url: str) -> None:
    app = aqw.App(url, lease_ttl=3.0)

    @app.task(name="double", keep_result=True)
    async def double(n: int) -> int:
        return n * 2

    @app.task(name="hang")
    async def hang(n: int) -> None:
        await asyncio.Event().wait()  # until the cancel stops it

    await app.worker(concurrency=4).run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
