"""The contract of ``broker.batches`` (``aqw.brokers.parts.BatchCounts``): a child counts
once, in its own settle step, by membership (a refused settle, a redelivered copy's second
settle and a paused ex-holder's late ack count nothing); the step that brings a sealed batch
to zero enqueues its callback once, under its idempotency key, with the counts in its
``aqw-batch-info`` header; sealing, an empty batch, a nested batch, a flow's gate."""

from __future__ import annotations

import asyncio
import json

import pytest

from ...brokers.base import Broker
from ...brokers.batching import (
    BATCH_HEADER,
    BATCH_INFO_HEADER,
    BATCH_INFO_SLOT,
    FLOW_INPUT_SLOT,
    BatchInfo,
    BatchSpec,
    callback_key,
)
from ...brokers.messages import Finish
from ...brokers.parts import BatchCounts
from ...errors import ConfigError
from ...job import Job
from ._kit import ContractBase, Kit, decoded, failure, fetch_n, fetch_one, job, sees_the_same, start


def _part(b: Broker) -> BatchCounts:
    if b.batches is None:
        pytest.skip(f"the {b.system} broker keeps no batch counts")
    return b.batches


def _callback(batch_id: str, kind: str = "complete") -> Job:
    return Job(
        task="summary",
        key=callback_key(batch_id, kind),
        headers={BATCH_INFO_HEADER: BATCH_INFO_SLOT},
    )


def _counts(i: BatchInfo) -> tuple[str, int, int, int, int]:
    return (i.state, i.total, i.pending, i.succeeded, i.failed)


class BatchesContract(ContractBase):
    """``broker.batches``: each child counted once in its settle; one callback job."""

    async def test_each_child_counts_once_and_the_callback_is_enqueued_once(self, kit: Kit) -> None:
        b = kit.broker
        part = _part(b)
        assert isinstance(part.shared, bool)
        cb, fail_cb = _callback("b1"), _callback("b1", "failure")
        await part.open(BatchSpec("b1", {"complete": cb, "failure": fail_cb}))
        one, two = job(1, headers={BATCH_HEADER: "b1"}), job(2, headers={BATCH_HEADER: "b1"})
        await part.add("b1", [one, two])
        info = await part.info("b1")
        assert info is not None and _counts(info) == ("open", 2, 2, 0, 0)
        assert await part.children("b1", 0, 10) == [one.id, two.id]
        by_id = {decoded(d).id: d for d in await fetch_n(kit, b, 2)}
        got, lease = await start(b, by_id[one.id])
        assert await b.ack(by_id[one.id], got, lease, 0.0, Finish(keep_for=60)) is True
        assert await b.ack(by_id[one.id], got, lease, 0.0, Finish(keep_for=60)) is False
        info = await part.info("b1")
        assert info is not None and _counts(info) == ("open", 2, 1, 1, 0)
        got2, lease2 = await start(b, by_id[two.id])
        assert await b.dead_letter(by_id[two.id], got2, failure(), 1, lease2, 60) is not None
        info = await part.info("b1")
        assert info is not None and _counts(info) == ("open", 2, 0, 1, 1)  # not sealed yet
        sealed = await part.seal("b1")
        assert _counts(sealed) == ("complete", 2, 0, 1, 1)
        assert sealed.callbacks == {"complete": cb.id, "failure": fail_cb.id}
        assert _counts(await part.seal("b1")) == _counts(sealed)  # a second seal: nothing more
        fired = {decoded(d).id: decoded(d) for d in await fetch_n(kit, b, 2)}
        assert set(fired) == {cb.id, fail_cb.id}
        counts = BatchInfo.from_json(fired[cb.id].headers[BATCH_INFO_HEADER])
        assert (counts.id, counts.succeeded, counts.failed, counts.total) == ("b1", 1, 1, 2)
        assert fired[cb.id].payload == cb.payload and fired[cb.id].key == cb.key
        if b.keyed_enqueue:  # the callback's idempotency key holds its job
            again = await b.publish_unique(_callback("b1"), 60, None)
            assert again == (cb.id, True)
        other = await kit.consumer("c2")
        seen = None if other.batches is None else await other.batches.info("b1")
        assert (seen is not None) == sees_the_same(kit, part.shared)

    async def test_a_paused_ex_holders_late_ack_counts_nothing(self, kit: Kit) -> None:
        a = await kit.consumer("a", visibility=1)
        c = await kit.consumer("b")
        part = _part(a)
        await part.open(BatchSpec("b2", {"complete": _callback("b2")}))
        child = job(3, headers={BATCH_HEADER: "b2"})
        await part.add("b2", [child])
        await part.seal("b2")
        d = await fetch_one(kit, a)
        got, lease = await start(a, d, ttl=0.05)
        await asyncio.sleep(0.1)  # A pauses past its lease; B takes the delivery over
        if kit.traits.visibility_lease:
            again = await fetch_one(kit, c, within=6)
        else:
            [again] = await c.reclaim(10, lambda _: 0.05, 0.05)
        got_b, lease_b = await start(c, again)
        assert await a.ack(d, got, lease, 0.0, Finish(keep_for=60)) is False  # A's late ack
        info = await part.info("b2")
        assert info is not None and _counts(info) == ("sealed", 1, 1, 0, 0)
        assert await c.ack(again, got_b, lease_b, 0.0, Finish(keep_for=60)) is True
        info = await part.info("b2")
        assert info is not None and _counts(info) == ("complete", 1, 0, 1, 0)
        assert list(info.callbacks) == ["complete"]

    async def test_sealing_an_empty_batch_nesting_and_refusals(self, kit: Kit) -> None:
        b = kit.broker
        part = _part(b)
        await part.open(BatchSpec("outer", {}))
        await part.open(BatchSpec("inner", {"complete": _callback("inner")}, parent="outer"))
        assert await part.children("outer", 0, 10) == ["batch:inner"]
        with pytest.raises(ConfigError, match="exists"):
            await part.open(BatchSpec("inner", {}))
        inner = await part.seal("inner")  # empty: complete at once, counted in its parent
        assert _counts(inner) == ("complete", 0, 0, 0, 0) and list(inner.callbacks) == ["complete"]
        outer = await part.info("outer")
        assert outer is not None and _counts(outer) == ("open", 1, 0, 1, 0)
        assert _counts(await part.seal("outer")) == ("complete", 1, 0, 1, 0)
        with pytest.raises(ConfigError, match="complete"):
            await part.add("outer", [job(4)])
        with pytest.raises(ConfigError):
            await part.add("never-opened", [job(5)])
        assert await part.info("never-opened") is None
        assert await part.cancel("never-opened") is None
        await fetch_one(kit, b)  # the inner batch's callback, and nothing else
        assert await b.fetch(10, 0) == []

    async def test_a_gate_enqueues_its_step_with_the_parents_results(self, kit: Kit) -> None:
        """A flow's gate: opened sealed with its parents as members; the last parent's
        settle enqueues the step with the parents' results (by name) as its payload."""
        b = kit.broker
        part = _part(b)
        p1 = job(6, headers={BATCH_HEADER: "flow gate"})
        p2 = job(7, headers={BATCH_HEADER: "flow gate"})
        step = Job(task="join", payload=FLOW_INPUT_SLOT, headers={BATCH_HEADER: "flow"})
        await part.open(BatchSpec("flow", {}, members=(p1.id, p2.id, step.id)))
        gate = BatchSpec("gate", {"success": step}, members=(p1.id, p2.id), sealed=True,
                         inputs=("left", "right"))  # fmt: skip
        await part.open(gate)
        await part.add("flow", [p1, p2])
        await part.seal("flow")
        for d in await fetch_n(kit, b, 2):
            got, lease = await start(b, d)
            result = json.dumps({"n": got.payload["n"]})
            assert await b.ack(d, got, lease, 0.0, Finish(keep_for=60, result=result)) is True
        d = await fetch_one(kit, b)
        ran = decoded(d)
        assert ran.id == step.id and ran.payload == {"left": {"n": 6}, "right": {"n": 7}}
        flow = await part.info("flow")
        assert flow is not None and _counts(flow) == ("sealed", 3, 1, 2, 0)
        got, lease = await start(b, d)
        assert await b.ack(d, got, lease, 0.0, Finish(keep_for=60)) is True
        flow = await part.info("flow")
        assert flow is not None and _counts(flow) == ("complete", 3, 0, 3, 0)
