"""Batches and flows on a real Redis Cluster (the cluster of ``tests/test_cluster.py``, one
of its own for this module): every key a batch step touches, inside every script, is in the
slot of its queue (the MONITOR watch checks each command), and the callbacks and steps run."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

import aqw
from aqw.brokers.batching import callback_key
from tests.test_cluster import (
    Cluster,
    SlotWatch,
    cluster_app,
    pytestmark,
)
from tests.test_cluster import cluster as cluster
from tests.test_cluster import slot_watch as slot_watch

# test_cluster's marks, in a group of this module's own: one worker, one cluster for the
# module (a group shared with test_cluster interleaves the two modules, and each switch
# starts a module's cluster again)
pytestmark = [m for m in pytestmark if m.name != "xdist_group"] + [
    pytest.mark.xdist_group("cluster-workflows")
]


class Item(BaseModel):
    n: int


async def test_a_batch_and_a_flow_stay_in_their_queues_slot(
    cluster: Cluster, slot_watch: SlotWatch
) -> None:
    queue = cluster.queue_on(sorted(cluster.masters())[1])
    done: list[object] = []
    async with cluster_app(cluster, queue) as app:

        @app.task(keep_result=True, max_retries=0)
        async def square(item: Item) -> int:
            if item.n < 0:
                raise ValueError("negative")
            return item.n * item.n

        @app.task(keep_result=True)
        async def total(parts: dict[str, int]) -> int:
            return sum(parts.values())

        @app.task(keep_result=True)
        async def added(values: list[int]) -> int:
            return sum(values)

        @app.task
        async def summary(ctx: aqw.Context) -> None:
            done.append(ctx.batch)

        async with app.batch(on_complete=summary, on_failure=summary, fail_fast=True) as batch:
            await batch.enqueue_many(square, [Item(n=i) for i in range(5)])
            async with batch.batch(on_complete=summary) as inner:
                await inner.enqueue(square, Item(n=-1))
        flow = aqw.Flow()
        a = flow.add(square, Item(n=2), name="a")
        b = flow.add(square, Item(n=3), name="b")
        flow.add(total, after=[a, b])
        handle = await app.start(flow)
        fan = aqw.Flow()  # a batch step after a step, and a step after the batch step
        first = fan.add(square, Item(n=1), name="first")
        squares = fan.batch(square, [Item(n=i) for i in range(1, 5)], after=first)
        fan.add(added, after=squares)
        fanned = await app.start(fan)
        async with asyncio.timeout(60):
            await app.worker(concurrency=4, burst=True).run()
            assert await handle.result(timeout=30) == 13
            assert await fanned.result(timeout=30) == 30  # 1 + 4 + 9 + 16
        info = await app.batch_info(batch.id)
        assert info is not None and info.state == "complete"
        assert info.failed == 1 and info.total == 6 and info.pending == 0
        assert sorted(info.callbacks) == ["complete", "failure"]
        assert len(done) == 3  # the inner batch's complete, the outer's complete and failure
        key = f"aqw:{{{queue}}}:key:{callback_key(batch.id, 'complete')}"
        assert await app.broker.client.exists(key) == 1  # type: ignore[attr-defined]
    runs = slot_watch.scripts()
    assert runs.get("batch_open", 0) >= 4 and runs.get("batch_add", 0) >= 2
