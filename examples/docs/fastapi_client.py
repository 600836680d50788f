"""Drive the example FastAPI app (examples/fastapi_app.py) in-process: the lifespan starts
the worker, a POST enqueues a job, GET /jobs/{id}/progress streams its progress as
server-sent events, GET /jobs/{id}/result waits for its result.

Needs the fastapi extra plus httpx and asgi-lifespan (all in aqw[dev]).
"""

import asyncio
import sys
from pathlib import Path

import httpx
from asgi_lifespan import LifespanManager

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/
from fastapi_app import create_app


async def main() -> None:
    api = create_app(broker="memory://", queue="docs-reports")
    async with LifespanManager(api) as manager:  # what uvicorn does on start and stop
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            print((await client.get("/health")).json())

            body = {"name": "q3", "seconds": 0.2, "steps": 2}
            accepted = (await client.post("/jobs", json=body)).json()
            print("accepted:", accepted)

            events = []
            async with client.stream("GET", accepted["status"] + "/progress") as stream:
                async for line in stream.aiter_lines():
                    if line.startswith("event: "):
                        events.append(line.removeprefix("event: "))
            print("events:", events)  # each ctx.progress update, then the end
            assert events == ["progress", "progress", "end"]
            missing = await client.get("/jobs/nope/progress")
            assert missing.status_code == 404

            reply = await client.get(accepted["status"] + "/result", params={"wait": 5})
            print("finished:", reply.json()["name"])  # waited without polling
            state = (await client.get(accepted["status"])).json()["state"]
            assert reply.status_code == 200 and state == "succeeded"

            bad = await client.post("/jobs", json={"name": ""})
            assert bad.status_code == 422  # validated before anything is enqueued


if __name__ == "__main__":
    asyncio.run(main())
