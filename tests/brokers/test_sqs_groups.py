"""Message groups from a payload key (``@app.task(group_key=...)``): SQS's MessageGroupId on
FIFO and standard (fair) queues, against moto in server mode through the real aioboto3 client;
on Redis and the in-process broker the group is carried in the ``aqw-group`` header only.
Fixtures: tests/brokers/conftest.py and tests/conftest.py."""

from __future__ import annotations

import asyncio
import functools
import time
from collections import defaultdict
from typing import Any

import aioboto3  # noqa: F401 - the sqs extra must be installed for these tests
import pytest
from pydantic import BaseModel

import aqw
from tests._helpers import depth, eventually, run_burst
from tests.conftest import Backend

from .conftest import AppFactory, SQSKit, broker_of

#: ``eventually``, polling moto gently (it is slow under load).
until = functools.partial(eventually, interval=0.05)


class Order(BaseModel):
    customer: str
    n: int


async def received(sqs: SQSKit, url: str, count: int) -> dict[str, dict[str, str]]:
    """Read ``count`` messages raw (hidden for a minute): job id -> their system attributes."""
    got: dict[str, dict[str, str]] = {}
    deadline = time.monotonic() + 20
    while len(got) < count and time.monotonic() < deadline:
        reply = await sqs.client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            VisibilityTimeout=60,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["MessageGroupId", "MessageDeduplicationId"],
        )
        for msg in reply.get("Messages", []):
            job_id = msg["MessageAttributes"]["aqw-job-id"]["StringValue"]
            got[job_id] = dict(msg.get("Attributes", {}))
    assert len(got) == count, got
    return got


@pytest.mark.timeout(40)
@pytest.mark.parametrize("name", ["orders.fifo", "orders"])
async def test_group_key_arrives_as_message_group_id(
    sqs: SQSKit, new_app: AppFactory, name: str
) -> None:
    url = await sqs.create(name, dead="orders-dead")
    app = new_app(sqs.url(name, dlq="orders-dead"))

    @app.task(name="bill", group_key=lambda p: p.customer)
    async def bill(order: Order) -> None: ...

    @app.task(name="plain")
    async def plain(n: int) -> None: ...

    ids = await bill.enqueue_many([Order(customer="c-1", n=1), {"customer": "c-2", "n": 2}])
    vip = await bill.enqueue(Order(customer="c-1", n=3), headers={"aqw-group": "vip"})
    other = await plain.enqueue(4)
    got = await received(sqs, url, 4)
    groups = {job_id: attrs.get("MessageGroupId") for job_id, attrs in got.items()}
    fifo = name.endswith(".fifo")
    assert groups == {
        ids[0]: "c-1",
        ids[1]: "c-2",
        vip: "vip",  # an enqueue's own header wins over the task's group_key
        other: "plain" if fifo else None,  # FIFO: the task name; standard: no group sent
    }
    if fifo:  # deduplication stays per job (or key), whatever the group
        assert {i: a["MessageDeduplicationId"] for i, a in got.items()} == {i: i for i in got}


@pytest.mark.timeout(60)
async def test_fifo_groups_interleave_and_keep_their_order(
    sqs: SQSKit, new_app: AppFactory
) -> None:
    """All of group A is sent before group B; B's first job still starts while A's first runs
    (one group, say the task name, would hold B back behind the whole of A), and within each
    group the jobs run one at a time, in order."""
    await sqs.create("steps.fifo", dead="steps-dead")
    app = new_app(sqs.url("steps.fifo", dlq="steps-dead"))
    b_started = asyncio.Event()
    events: list[tuple[str, str, int]] = []
    running: dict[str, int] = defaultdict(int)
    most: dict[str, int] = defaultdict(int)
    waited: list[bool] = []

    @app.task(name="step", group_key=lambda p: p.customer)
    async def step(order: Order) -> None:
        group = order.customer
        events.append(("start", group, order.n))
        running[group] += 1
        most[group] = max(most[group], running[group])
        if (group, order.n) == ("A", 0):
            try:
                await asyncio.wait_for(b_started.wait(), 20)
                waited.append(True)
            except TimeoutError:
                waited.append(False)
        if group == "B":
            b_started.set()
        await asyncio.sleep(0.01)
        running[group] -= 1
        events.append(("end", group, order.n))

    for group in "AB":
        await step.enqueue_many([Order(customer=group, n=i) for i in range(5)])
    async with app.worker(concurrency=8, grace=1):
        await until(lambda: sum(e[0] == "end" for e in events) == 10, 50, "10 FIFO jobs")
    assert waited == [True], "B's first job did not start while A's first one ran"
    for group in "AB":
        mine = [(kind, n) for kind, g, n in events if g == group]
        assert mine == [(kind, n) for n in range(5) for kind in ("start", "end")], (group, mine)
        assert most[group] == 1
    assert broker_of(app).fifo


@pytest.mark.timeout(30)
async def test_bad_group_values_are_errors_naming_the_option(
    sqs: SQSKit, new_app: AppFactory
) -> None:
    url = await sqs.create("bad.fifo", dead="bad-dead")
    app = new_app(sqs.url("bad.fifo", dlq="bad-dead"))
    value: dict[str, Any] = {}

    @app.task(name="bill", group_key=lambda p: value["group"])
    async def bill(order: Order) -> None: ...

    for bad in ["", "x" * 129, "a b", "caf\u00e9", "tab\t", 7, None, b"bytes"]:
        value["group"] = bad
        with pytest.raises(aqw.ConfigError, match=r"^task 'bill': group_key must be a string"):
            await bill.enqueue(Order(customer="c", n=1))
    # One bad group among good ones: nothing of the batch is sent.
    values = iter(["ok", "not ok"])

    @app.task(name="many", group_key=lambda p: next(values))
    async def many(order: Order) -> None: ...

    with pytest.raises(aqw.ConfigError, match="group_key"):
        await many.enqueue_many([Order(customer="c", n=1), Order(customer="c", n=2)])
    with pytest.raises(aqw.ConfigError, match=r"headers\['aqw-group'\]"):
        await app.enqueue("bill", [Order(customer="c", n=1)], headers={"aqw-group": "a b"})
    with pytest.raises(aqw.ConfigError, match=r"^task 'worse': group_key must be a function"):

        @app.task(name="worse", group_key="customer")  # type: ignore[arg-type]
        async def worse(order: Order) -> None: ...

    assert await sqs.count(url) == 0
    value["group"] = "!#$%&'()*+,-./:;<=>?@[\\]^_`{|}~" + "x" * 97  # 128, all allowed
    await bill.enqueue(Order(customer="c", n=1))
    assert await sqs.count(url) == 1


@pytest.mark.timeout(40)
async def test_a_long_delay_sent_again_keeps_its_group(sqs: SQSKit, new_app: AppFactory) -> None:
    """A message received before its not-before time is sent again as a fresh message: on a
    standard queue it keeps its MessageGroupId (a fair queue's tenant)."""
    url = await sqs.create("later", dead="later-dead")
    app = new_app(sqs.url("later", dlq="later-dead"))
    broker = broker_of(app)
    job = aqw.Job(task="tick", payload=1, headers={"aqw-group": "tenant-9"})
    await sqs.client.send_message(QueueUrl=url, **broker._entry(job, 0, time.time() + 2))
    assert await broker.fetch(10, 1) == []  # not due: sent again with DelaySeconds, then deleted
    got = await received(sqs, url, 1)
    assert got[job.id]["MessageGroupId"] == "tenant-9"


# -- the other brokers: accepted, carried in the header, checked the same way -----------------


@pytest.mark.timeout(30)
async def test_group_key_on_redis_and_memory_is_carried_not_enforced(backend: Backend) -> None:
    app = backend.app()
    seen: dict[int, str | None] = {}
    value: dict[str, Any] = {}

    @app.task(name="bill", group_key=lambda p: p.customer)
    async def bill(order: Order, ctx: aqw.Context) -> None:
        seen[order.n] = ctx.job.headers.get("aqw-group")

    @app.task(name="odd", group_key=lambda p: value["group"])
    async def odd(order: Order) -> None: ...

    await bill.enqueue_many([Order(customer=f"c-{i % 2}", n=i) for i in range(4)])
    await bill.enqueue(Order(customer="c-0", n=4), headers={"aqw-group": "vip"})
    for bad in ["", "a b", 7]:
        value["group"] = bad
        with pytest.raises(aqw.ConfigError, match=r"^task 'odd': group_key must be a string"):
            await odd.enqueue(Order(customer="c", n=1))
    await run_burst(app, concurrency=4)
    assert seen == {0: "c-0", 1: "c-1", 2: "c-0", 3: "c-1", 4: "vip"}
    assert await depth(app) == (0, 0, 0, 0)
