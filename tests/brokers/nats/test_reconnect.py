"""A fetch waiting when its server is killed and restarted: its pull request dies with the
server, and nats-py waits such a request out to its end. A plain queue's fetch pulls in
slices (``_levels.PULL_SLICE``), so after the reconnect the next slice asks again and the
fetch brings a job published meanwhile, within its block, instead of sitting out the
block on the dead request and coming back empty."""

from __future__ import annotations

import asyncio

import pytest

from aqw.job import Job
from tests._helpers import eventually

from .conftest import Server, broker

# nats-py, reconnecting from a server killed under it, can leave the dead connection's socket
# for the garbage collector (test_chaos.py says more).
pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


async def test_a_fetch_asks_again_after_its_server_came_back(private_server: Server) -> None:
    b = broker("reconnect", private_server.url, ack_wait=30.0)
    try:
        await b.connect()
        fetching = asyncio.create_task(b.fetch(1, 30.0))  # a block longer than the test waits
        await asyncio.sleep(0.3)  # its pull request is on the server now
        private_server.kill()
        private_server.start()
        job = Job(task="work", payload={"n": 1})

        async def published() -> bool:
            try:
                await asyncio.wait_for(b.publish([job]), 2)
            except Exception:  # still reconnecting: again
                return False
            return True

        await eventually(published, 30, "a publish after the restart")
        got = await asyncio.wait_for(fetching, 20)  # well within its 30 s block
        assert [Job.decode(d.data).id for d in got] == [job.id]
    finally:
        await b.close()
