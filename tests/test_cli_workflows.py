"""``aqw batch show|cancel`` and ``aqw flow show`` on the real Redis, in process (``main``)."""

from __future__ import annotations

import asyncio
import json

import pytest

import aqw
from aqw.cli._main import main

pytestmark = pytest.mark.redis


def _app(redis_url: str, queue: str) -> tuple[aqw.App, aqw.Task[int], aqw.Task[None]]:
    app = aqw.App(redis_url, queue=queue)

    @app.task(name="child", keep_result=True)
    async def child(n: int) -> int:
        return n

    @app.task(name="after")
    async def after(n: int) -> None:
        return None

    return app, child, after


def test_batch_show_cancel_and_flow_show(
    redis_url: str, queue_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def setup() -> tuple[str, str]:
        app, child, after = _app(redis_url, queue_name)
        async with app.batch(on_complete=after, payload=0) as batch:
            await batch.enqueue_many(child, [1, 2, 3])
        flow = aqw.Flow()
        flow.add(after, after=flow.add(child, 5))
        handle = await app.start(flow)
        await app.close()
        return batch.id, handle.id

    batch_id, flow_id = asyncio.run(setup())
    where = ["--broker", redis_url, "--queue", queue_name]
    assert main(["batch", "show", batch_id, *where]) == 0
    out = capsys.readouterr().out
    assert f"batch {batch_id}: sealed" in out and "0/3 done" in out and "3 pending" in out
    assert main(["flow", "show", flow_id, *where, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["state"] == "sealed"
    assert {n: s["state"] for n, s in shown["steps"].items()} == {
        "child": "queued",
        "after": "waiting",
    }
    assert main(["batch", "cancel", batch_id, *where, "--json"]) == 0
    cancelled = json.loads(capsys.readouterr().out)
    assert (cancelled["state"], cancelled["pending"]) == ("sealed", 3)  # ended by the workers
    assert main(["batch", "show", "no-such-batch", *where]) == 6
    assert "no batch" in capsys.readouterr().out
    assert main(["flow", "show", "no-such-flow", *where]) == 6


def test_flow_show_names_a_batch_step_and_its_batch(
    redis_url: str, queue_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def setup() -> tuple[str, str]:
        app, child, _ = _app(redis_url, queue_name)
        flow = aqw.Flow()
        flow.batch(child, [1, 2], name="fan")
        handle = await app.start(flow)
        info = await app.flow_info(handle.id)
        await app.close()
        assert info is not None
        return handle.id, info.steps["fan"].job_id

    flow_id, batch_id = asyncio.run(setup())
    where = ["--broker", redis_url, "--queue", queue_name]
    assert main(["flow", "show", flow_id, *where]) == 0
    assert f"fan: queued (batch of 2 {batch_id})" in capsys.readouterr().out
    assert main(["batch", "show", batch_id, *where]) == 0  # the step is a batch
    assert "0/2 done" in capsys.readouterr().out
