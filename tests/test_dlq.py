"""The dead-letter queue: malformed input ends there with a readable reason while good jobs
flow, and ``app.dlq`` lists, gets, replays (by id, task, all; with an edited payload) and purges
(by age, by id) exactly the selected entries; the DLQ is capped and counts what it trims.

Runs on the memory broker, fakeredis and the real Redis.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest
from conftest import REDIS_URL, Backend
from pydantic import BaseModel, Field, ValidationError, field_validator

import aqw
from aqw.brokers.memory import MemoryBroker
from aqw.brokers.redis import RedisBroker
from tests._helpers import depth, eventually, publish_raw

pytestmark = pytest.mark.timeout(40)

FAST = aqw.RetryPolicy(max_retries=2, base=0.01, cap=0.02)
TEN_MB = 10 * 1024 * 1024


def make_app(backend: Backend, **broker_options: Any) -> aqw.App:
    """An app on the backend's queue whose broker gets ``broker_options`` (e.g. dlq_limit)."""
    broker: aqw.Broker
    if backend.kind == "memory":
        broker = MemoryBroker(backend.queue, **broker_options)
    elif backend.kind == "fakeredis":
        broker = RedisBroker(backend.client(), backend.queue, **broker_options)
    else:
        broker = RedisBroker(REDIS_URL, backend.queue, **broker_options)
    app = aqw.App(broker, retry=FAST)
    backend.apps.append(app)  # closed at teardown
    return app


# -- malformed input ------------------------------------------------------------------------------


class Order(BaseModel):
    sku: str = Field(min_length=1)
    qty: int = Field(gt=0)


def envelope(task: str, payload: Any) -> bytes:
    return aqw.Job(task=task, payload=payload).encode()


#: name -> (raw "j" value, error type, a readable part of the reason)
MALFORMED: dict[str, tuple[bytes, str, str]] = {
    "not json": (b"{this is not json", "MalformedJob", "message: Invalid JSON"),
    "empty": (b"", "MalformedJob", "Invalid JSON"),
    "json null": (b"null", "MalformedJob", "invalid job envelope"),
    "json array": (b'["work", 1]', "MalformedJob", "invalid job envelope"),
    "missing task": (b'{"v": 1, "id": "m1", "payload": 1}', "MalformedJob", "task: Field required"),
    "task not a string": (
        b'{"task": 123, "payload": 1}',
        "MalformedJob",
        "task: Input should be a valid string",
    ),
    "attempt not a number": (
        b'{"task": "work", "payload": 1, "attempt": "many"}',
        "MalformedJob",
        "attempt: Input should be a valid integer",
    ),
    "attempt zero": (
        b'{"task": "work", "payload": 1, "attempt": 0}',
        "MalformedJob",
        "attempt: Input should be greater than or equal to 1",
    ),
    "header not a string": (
        b'{"task": "work", "payload": 1, "headers": {"h": 1}}',
        "MalformedJob",
        "headers.h: Input should be a valid string",
    ),
    "unknown envelope version": (
        b'{"v": 9, "task": "work", "payload": 1}',
        "MalformedJob",
        "v: Input should be 1",
    ),
    "invalid utf-8": (
        b'{"task": "work", "payload": "\xff\xfe\xfd"}',
        "MalformedJob",
        "message is not valid UTF-8",
    ),
    "unknown task": (envelope("no_such_task", 1), "UnknownTask", "unknown task 'no_such_task'"),
    "payload of the wrong type": (
        envelope("work", {"n": 1}),
        "ValidationError",
        "payload failed validation: payload: Input should be a valid integer",
    ),
    "payload failing the model": (
        envelope("order", {"sku": "a", "qty": -1}),
        "ValidationError",
        "payload failed validation: qty: Input should be greater than 0",
    ),
    "payload missing a field": (
        envelope("order", {"qty": 2}),
        "ValidationError",
        "sku: Field required",
    ),
    # Over the payload cap (1 MiB by default): refused before it is parsed.
    "10 MB payload string for an int": (
        envelope("work", "9" * 40 + "x" * TEN_MB),
        "PayloadTooLarge",
        "over its max_payload_bytes of 1048576",
    ),
    "10 MB of junk": (b"junk" * (TEN_MB // 4), "PayloadTooLarge", "over its max_payload_bytes"),
}


@pytest.mark.timeout(60)
async def test_malformed_input_is_dead_lettered_readably_and_good_jobs_flow(
    backend: Backend,
) -> None:
    app = backend.app(retry=FAST)
    done: Counter[int] = Counter()
    orders: list[Order] = []

    @app.task(name="work")
    async def work(n: int) -> None:
        done[n] += 1

    @app.task(name="order")
    async def order(item: Order) -> None:
        orders.append(item)

    await app.broker.connect()
    expected = dict(MALFORMED)
    bad = list(MALFORMED.values())
    good = 0
    for raw, _, _ in bad:
        await work.enqueue(good)
        good += 1
        await publish_raw(backend, app, {"j": raw})
        await work.enqueue(good)
        good += 1
    await order.enqueue(Order(sku="fine", qty=1))
    if backend.raw is not None:  # entries without a "j" field at all
        await publish_raw(backend, app, {"job": b'{"task": "work", "payload": 1}'})
        await publish_raw(backend, app, {"x": b"\xff\x00binary"})
        expected["no j field"] = (
            b'{\'job\': b\'{"task": "work", "payload": 1}\'}',
            "MalformedJob",
            "invalid job envelope",
        )
        expected["no j field, binary"] = (
            b"{'x': b'\\xff\\x00binary'}",
            "MalformedJob",
            "invalid job envelope",
        )
    for n in range(good, good + 10):
        await work.enqueue(n)
    good += 10

    async with app.worker(concurrency=8) as worker:
        await eventually(
            lambda: worker.stats.processed == good + 1 and worker.stats.dead == len(expected),
            30,
            "every good job done and every bad one dead-lettered",
        )
        await asyncio.sleep(0.2)
    assert done == Counter(range(good)), "a good job was lost or run twice"
    assert orders == [Order(sku="fine", qty=1)]
    s = worker.stats
    assert (s.processed, s.dead, s.retried, s.failed) == (good + 1, len(expected), 0, 0)
    unreadable = ("MalformedJob", "PayloadTooLarge")
    assert s.malformed == sum(1 for _, kind, _ in expected.values() if kind in unreadable)
    dead = await app.dlq.list(limit=1000)
    assert len(dead) == len(expected)
    by_data = {d.data: d for d in dead}
    assert len(by_data) == len(dead)
    for name, (raw, error_type, reason) in expected.items():
        entry = by_data.get(raw)
        assert entry is not None, f"{name}: not in the DLQ"
        assert entry.error_type == error_type, f"{name}: {entry.error_type} {entry.error[:200]}"
        assert reason in entry.error, f"{name}: {entry.error[:300]!r}"
        assert len(entry.error) < 2000, f"{name}: the reason is not short"
        assert entry.attempts == 1, name
        assert entry.worker == worker.name
        if error_type == "MalformedJob":
            assert (entry.task, entry.job_id, entry.job) == ("", "", None), name
        elif error_type == "PayloadTooLarge":  # refused unread: the entry keeps the bytes
            assert (entry.task, entry.job_id) == ("", ""), name
            assert len(entry.data) >= TEN_MB, name
        else:
            assert entry.job is not None and entry.task == entry.job.task, name
    assert await depth(app) == (0, 0, 0, len(expected))
    if backend.raw is not None:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        assert await backend.raw.xlen(broker.keys.stream) == 0


class Picky(BaseModel):
    n: int

    @field_validator("n")
    @classmethod
    def not_thirteen(cls, v: int) -> int:
        if v == 13:
            raise LookupError("thirteen is not in the table")  # not a ValueError: not wrapped
        return v


async def test_a_validator_raising_a_non_value_error_dead_letters_at_once() -> None:
    app = aqw.App(MemoryBroker("t-picky"), lease_ttl=0.2, retry=FAST)

    @app.task(name="picky")
    async def picky(p: Picky) -> None:
        pass

    broker = app.broker
    assert isinstance(broker, MemoryBroker)
    await broker.publish_raw(envelope("picky", {"n": 13}))
    await picky.enqueue(Picky(n=1))
    async with app.worker() as worker:
        deadline = time.monotonic() + 1.5
        while worker.stats.dead == 0 and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    assert worker.stats.processed == 1
    dead_jobs = await app.dlq.list()
    assert len(dead_jobs) == 1, "the bad payload was not dead-lettered within 1.5 s"
    dead = dead_jobs[0]
    assert dead.error_type == "LookupError"
    assert "thirteen" in dead.error
    assert dead.attempts == 1


# -- producing dead jobs for the API tests ---------------------------------------------------------


class Mail(BaseModel):
    to: str = Field(min_length=3)


class Shop:
    """An app with three tasks that fail until ``healthy`` is set."""

    def __init__(self, app: aqw.App) -> None:
        self.app = app
        self.healthy = False
        self.ran: list[tuple[str, Any, int, dict[str, str]]] = []

        @app.task(name="charge", max_retries=2)
        async def charge(amount: int, ctx: aqw.Context) -> None:
            self.ran.append(("charge", amount, ctx.attempt, dict(ctx.job.headers)))
            if not self.healthy:
                if amount < 0:
                    raise aqw.Reject(f"negative amount {amount}")
                raise ValueError(f"card declined for {amount}")

        @app.task(name="email", max_retries=0)
        async def email(mail: Mail, ctx: aqw.Context) -> None:
            self.ran.append(("email", mail.to, ctx.attempt, dict(ctx.job.headers)))
            if not self.healthy or mail.to.endswith(".invalid"):
                raise aqw.Reject(f"mailbox {mail.to} bounced")

        @app.task(name="order")
        async def order(item: Order) -> None:
            self.ran.append(("order", item.qty, 1, {}))
            if not self.healthy or item.qty > 10:
                raise aqw.Reject(f"{item.qty} is more than we have")

        self.charge, self.email, self.order = charge, email, order

    def ran_ok(self, task: str) -> list[Any]:
        return [value for name, value, _, _ in self.ran if name == task]


async def dead_letter_all(shop: Shop, worker: aqw.Worker, total: int) -> None:
    await eventually(lambda: worker.stats.dead >= total, 10, f"{total} dead letters")
    assert worker.stats.dead == total


# -- list and get ---------------------------------------------------------------------------------


async def test_list_filters_get_count_and_iterate(backend: Backend) -> None:
    shop = Shop(backend.app(retry=FAST))
    app = shop.app
    charge_ids = [await shop.charge.enqueue(n) for n in (10, 20, 30)]
    reject_id = await shop.charge.enqueue(-5)
    mail_ids = [await shop.email.enqueue(Mail(to=t)) for t in ("a@x.org", "b@y.org")]
    async with app.worker(concurrency=1) as worker:
        await dead_letter_all(shop, worker, 6)

    everything = await app.dlq.list()
    assert len(everything) == 6 == await app.dlq.count()
    times = [d.last_failed_at for d in everything]
    assert times == sorted(times), "not oldest first"
    assert sorted(d.job_id for d in everything) == sorted([*charge_ids, reject_id, *mail_ids])

    charges = await app.dlq.list(task="charge")
    assert sorted(d.job_id for d in charges) == sorted([*charge_ids, reject_id])
    rejects = await app.dlq.list(error_type="Reject")
    assert sorted(d.job_id for d in rejects) == sorted([reject_id, *mail_ids])
    both = await app.dlq.list(task="charge", error_type="Reject")
    assert [d.job_id for d in both] == [reject_id]
    assert [d.attempts for d in both] == [1]
    declined = await app.dlq.list(task="charge", error_type="ValueError")
    assert sorted(d.job_id for d in declined) == sorted(charge_ids)
    assert all(
        d.attempts == 3 and d.error.startswith("ValueError: card declined") for d in declined
    )
    assert await app.dlq.list(task="nope") == []
    assert await app.dlq.list(error_type="KeyError") == []
    assert [d.id for d in await app.dlq.list(limit=2)] == [d.id for d in everything[:2]]
    assert [d.id for d in await app.dlq.list(task="charge", limit=1)] == [charges[0].id]

    paged = [d async for d in app.dlq.iterate(page=2)]
    assert [d.id for d in paged] == [d.id for d in everything]
    assert [d.id async for d in app.dlq.iterate(task="email", page=1)] == [
        d.id for d in everything if d.task == "email"
    ]

    one = everything[3]
    got = await app.dlq.get(one.id)
    assert got == one
    assert got is not None and got.job is not None and got.job.id == got.job_id
    for missing in ("0-1", "99999999999999-0", "not-an-id", ""):
        assert await app.dlq.get(missing) is None, missing
    assert await depth(app) == (0, 0, 0, 6)


# -- replay ---------------------------------------------------------------------------------------


async def test_replay_by_id_by_task_and_all_resets_the_attempt(backend: Backend) -> None:
    shop = Shop(backend.app(retry=FAST))
    app = shop.app
    for n in (1, 2, 3):
        await shop.charge.enqueue(n)
    for t in ("a@x.org", "b@y.org"):
        await shop.email.enqueue(Mail(to=t))
    await shop.order.enqueue(Order(sku="s", qty=4))
    async with app.worker(concurrency=2) as worker:
        await dead_letter_all(shop, worker, 6)
        dead = await app.dlq.list()
        assert {d.task: d.attempts for d in dead} == {"charge": 3, "email": 1, "order": 1}
        shop.healthy = True
        shop.ran.clear()

        # by id: exactly that one
        first = next(d for d in dead if d.task == "charge")
        assert await app.dlq.replay([first.id]) == 1
        await eventually(lambda: len(shop.ran) == 1, 5, "the replayed job")
        assert shop.ran[0][:3] == ("charge", first.job.payload if first.job else None, 1)
        assert not any(k.startswith("aqw-") for k in shop.ran[0][3]), "old retry headers kept"
        assert await app.dlq.get(first.id) is None
        assert await app.dlq.count() == 5
        assert await app.dlq.replay([first.id]) == 0  # gone: nothing to replay twice

        # by task: both emails, nothing else
        assert await app.dlq.replay(task="email") == 2
        await eventually(lambda: len(shop.ran) == 3, 5, "the replayed emails")
        assert sorted(shop.ran_ok("email")) == ["a@x.org", "b@y.org"]
        assert sorted(d.task for d in await app.dlq.list()) == ["charge", "charge", "order"]

        # all: the rest
        assert await app.dlq.replay(all=True) == 3
        await eventually(lambda: len(shop.ran) == 6, 5, "the rest")
        assert await app.dlq.replay(all=True) == 0
        await asyncio.sleep(0.2)
    assert sorted(shop.ran_ok("charge")) == [1, 2, 3]
    assert shop.ran_ok("order") == [4]
    assert [attempt for _, _, attempt, _ in shop.ran] == [1] * 6
    assert worker.stats.processed == 6
    assert await depth(app) == (0, 0, 0, 0)
    with pytest.raises(aqw.ConfigError):
        await app.dlq.replay()
    with pytest.raises(aqw.ConfigError):
        await app.dlq.replay([])


async def test_replay_with_an_edited_payload_validates_it_first(backend: Backend) -> None:
    shop = Shop(backend.app(retry=FAST))
    app = shop.app
    await shop.order.enqueue(Order(sku="s", qty=50))
    await shop.email.enqueue(Mail(to="nobody@x.invalid"))
    async with app.worker(concurrency=2) as worker:
        await dead_letter_all(shop, worker, 2)
        shop.healthy = True
        [too_many] = await app.dlq.list(task="order")
        [bounced] = await app.dlq.list(task="email")
        before = await app.dlq.list()

        with pytest.raises(ValidationError):
            await app.dlq.replay([too_many.id], edit_payload={"sku": "s", "qty": 0})
        with pytest.raises(ValidationError):
            await app.dlq.replay([too_many.id], edit_payload={"qty": 5})
        assert await app.dlq.list() == before  # nothing moved

        assert await app.dlq.replay([too_many.id], edit_payload={"sku": "s", "qty": 5}) == 1
        assert await app.dlq.replay([bounced.id], edit_payload=Mail(to="fixed@x.org")) == 1
        await eventually(lambda: worker.stats.processed == 2, 5, "the edited jobs")
        await asyncio.sleep(0.1)
    assert shop.ran_ok("order") == [50, 5]
    assert shop.ran_ok("email") == ["nobody@x.invalid", "fixed@x.org"]
    assert await depth(app) == (0, 0, 0, 0)


async def test_an_undecodable_dead_message_is_not_replayed(backend: Backend) -> None:
    shop = Shop(backend.app(retry=FAST))
    app = shop.app
    await app.broker.connect()
    await publish_raw(backend, app, {"j": b"garbage"})
    await shop.email.enqueue(Mail(to="c@z.org"))
    async with app.worker() as worker:
        await dead_letter_all(shop, worker, 2)
        shop.healthy = True
        [junk] = [d for d in await app.dlq.list() if d.job is None]
        assert await app.dlq.replay([junk.id]) == 0
        assert await app.dlq.replay(all=True) == 1  # only the email
        await eventually(lambda: worker.stats.processed == 1, 5, "the email")
    assert [d.id for d in await app.dlq.list()] == [junk.id]
    assert await depth(app) == (0, 0, 0, 1)


# -- purge ----------------------------------------------------------------------------------------


async def test_purge_by_age_by_id_and_by_task(backend: Backend) -> None:
    shop = Shop(backend.app(retry=FAST))
    app = shop.app
    async with app.worker(concurrency=4) as worker:
        old = [await shop.email.enqueue(Mail(to=f"old{i}@x.org")) for i in range(3)]
        await dead_letter_all(shop, worker, 3)
        await asyncio.sleep(0.6)
        new = [await shop.email.enqueue(Mail(to=f"new{i}@x.org")) for i in range(3)]
        new.append(await shop.order.enqueue(Order(sku="s", qty=99)))
        await dead_letter_all(shop, worker, 7)

    with pytest.raises(aqw.ConfigError):
        await app.dlq.purge()
    assert await app.dlq.purge(older_than=30) == 0  # none is that old
    dead = {d.job_id: d.last_failed_at for d in await app.dlq.list()}
    middle = (max(dead[i] for i in old) + min(dead[i] for i in new)) / 2
    assert min(dead[i] for i in new) - max(dead[i] for i in old) >= 0.6
    assert await app.dlq.purge(older_than=time.time() - middle) == 3  # exactly the old ones
    left = await app.dlq.list()
    assert sorted(d.job_id for d in left) == sorted(new)
    assert not set(old) & {d.job_id for d in left}

    assert await app.dlq.purge(ids=[left[0].id, "0-1"]) == 1
    assert await app.dlq.purge(ids=[left[0].id]) == 0
    assert await app.dlq.count() == 3
    [order] = await app.dlq.list(task="order")
    assert await app.dlq.purge(task="email") == 2
    assert [d.id for d in await app.dlq.list()] == [order.id]
    assert await app.dlq.purge(older_than=0) == 1
    assert await depth(app) == (0, 0, 0, 0)


# -- the size limit -------------------------------------------------------------------------------


async def test_the_dlq_keeps_the_newest_entries_and_counts_the_trimmed(backend: Backend) -> None:
    app = make_app(backend, dlq_limit=5)
    runs: list[int] = []

    @app.task(name="reject")
    async def reject(n: int) -> None:
        runs.append(n)
        raise aqw.Reject(f"no {n}")

    for n in range(8):
        await reject.enqueue(n)
    # one worker throughout: on fakeredis, a stopped worker's cancelled XREADGROUP BLOCK
    # still takes the next entry (it then waits for reclaim after the lease ttl)
    async with app.worker(concurrency=1) as worker:
        await eventually(lambda: worker.stats.dead == 8, 10, "8 dead letters")
        assert runs == list(range(8))
        dead = await app.dlq.list()
        assert [d.job.payload for d in dead if d.job is not None] == [3, 4, 5, 6, 7]
        assert await app.dlq.count() == 5
        stats = await app.broker.stats()
        assert (stats.get("dead"), stats.get("dlq_trimmed")) == (8, 3)
        await reject.enqueue(8)
        await eventually(lambda: worker.stats.dead == 9, 10, "the 9th dead letter")
    assert [d.job.payload for d in await app.dlq.list() if d.job is not None] == [4, 5, 6, 7, 8]
    assert (await app.broker.stats()).get("dlq_trimmed") == 4
