"""Debounced enqueue (``enqueue(..., key=k, debounce=s, debounce_max=m)``): a burst of enqueues
of one key runs one job, with the last payload; ``debounce_max`` bounds the push-back; a job
that has started is never touched; concurrent producers still make one job per burst; bad
arguments are ``ConfigError``s naming the argument; SQS refuses it.

Bursts are enqueued before a worker runs where the test is about what one burst makes: then
nothing can promote the job mid-burst however slow the machine, and no timing is assumed.
"""

from __future__ import annotations

import asyncio
import math
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from conftest import Backend

import aqw
from aqw.brokers.memory import MemoryBroker
from tests._helpers import depth, eventually, moto_server
from tests.testkit._clocks import clock_for

pytestmark = pytest.mark.timeout(60)

DEBOUNCE = 0.3


def register(app: aqw.App, runs: list[tuple[str, int]], name: str = "sync") -> Any:
    """A task that records (its key's letter, payload) per run and keeps its payload."""

    @app.task(name=name, keep_result=True)
    async def sync(key: str, n: int) -> int:
        runs.append((key, n))
        return n

    return sync


async def drain(app: aqw.App, ids: list[str]) -> list[Any]:
    """Run a worker until every job of ``ids`` has ended; their results."""
    async with app.worker(concurrency=8):
        return [await app.result(i, timeout=20) for i in ids]


# -- one burst, one run ------------------------------------------------------------------------


async def test_a_burst_runs_once_with_the_last_payload(backend: Backend) -> None:
    app = backend.app()
    runs: list[tuple[str, int]] = []
    sync = register(app, runs)
    got = [
        await sync.enqueue({"key": "a", "n": n}, key="user:a", debounce=DEBOUNCE) for n in range(50)
    ]
    assert len(set(got)) == 1  # one job id for the whole burst
    assert [e.duplicate for e in got] == [False] + [True] * 49
    info = await app.job(got[0])
    assert info is not None and info.state == "delayed" and info.key == "user:a"
    assert await depth(app) == (0, 0, 1, 0)  # one waiting job, not fifty
    assert await drain(app, [got[0]]) == [49]
    assert runs == [("a", 49)]


async def test_each_enqueue_pushes_the_start_back(backend: Backend) -> None:
    app = backend.app()
    sync = register(app, [])
    first = await sync.enqueue({"key": "a", "n": 1}, key="k", debounce=5.0)
    before = await app.job(first)
    await asyncio.sleep(0.05)
    again = await sync.enqueue({"key": "a", "n": 2}, key="k", debounce=5.0)
    after = await app.job(first)
    assert again == first and again.duplicate
    assert before is not None and after is not None
    assert before.run_at is not None and after.run_at is not None
    assert after.run_at > before.run_at  # the record shows the new start
    assert after.state == "delayed"


async def test_debounce_max_bounds_the_push_back(backend: Backend) -> None:
    app = backend.app()
    sync = register(app, [])
    t0 = time.time()
    first = await sync.enqueue({"key": "a", "n": 0}, key="k", debounce=1.0, debounce_max=1.5)
    t1 = time.time()
    for n in range(1, 7):  # a trickle going on past first + 0.5: the bound takes over
        await asyncio.sleep(0.1)
        again = await sync.enqueue({"key": "a", "n": n}, key="k", debounce=1.0, debounce_max=1.5)
        assert again == first  # no worker: still the same waiting job
    info = await app.job(first)
    assert info is not None and info.run_at is not None
    # Without the bound the start would be the last enqueue + 1.0, past t0 + 1.6.
    assert t0 + 1.5 - 0.01 <= info.run_at.timestamp() <= t1 + 1.5 + 0.01


async def test_a_steady_trickle_still_runs_by_first_plus_max(backend: Backend) -> None:
    app = backend.app()
    runs: list[tuple[str, int]] = []
    sync = register(app, runs)
    loop = asyncio.get_running_loop()
    async with clock_for(backend), app.worker(concurrency=4):  # memory: 2 s without waiting
        await asyncio.sleep(0.1)
        end = loop.time() + 2.0
        n = 0
        while loop.time() < end:  # never quiet for debounce: only the bound runs it
            await sync.enqueue({"key": "a", "n": n}, key="k", debounce=0.3, debounce_max=0.4)
            n += 1
            await asyncio.sleep(0.03)
        during = len(runs)
        await eventually(lambda: runs and runs[-1][1] == n - 1, 10, "the last payload's run")
    assert during >= 1  # bounded: ran while the trickle went on (about 4 times)
    assert len(runs) < n  # and still debounced


async def test_two_keys_are_independent(backend: Backend) -> None:
    app = backend.app()
    runs: list[tuple[str, int]] = []
    sync = register(app, runs)
    ids: dict[str, set[str]] = {"a": set(), "b": set()}
    for n in range(10):
        for k in "ab":
            e = await sync.enqueue({"key": k, "n": n}, key=f"user:{k}", debounce=DEBOUNCE)
            ids[k].add(e)
    assert len(ids["a"]) == len(ids["b"]) == 1 and ids["a"] != ids["b"]
    assert await drain(app, [*ids["a"], *ids["b"]]) == [9, 9]
    assert sorted(runs) == [("a", 9), ("b", 9)]


async def test_the_next_burst_runs_again(backend: Backend) -> None:
    app = backend.app()
    runs: list[tuple[str, int]] = []
    sync = register(app, runs)
    # One worker throughout: on fakeredis a stopped worker's blocked read, cancelled on the
    # client, still takes the next entry in the in-process server.
    async with app.worker(concurrency=4):
        first = await sync.enqueue({"key": "a", "n": 1}, key="k", debounce=0.05)
        assert await app.result(first, timeout=20) == 1
        # A debounce key is no idempotency key: the finished job does not block the next one.
        second = await sync.enqueue({"key": "a", "n": 2}, key="k", debounce=0.05)
        assert second != first and not second.duplicate
        assert await app.result(second, timeout=20) == 2
    assert runs == [("a", 1), ("a", 2)]


async def test_a_burst_waits_in_its_priority_levels_delayed_set(backend: Backend) -> None:
    app = backend.app()
    runs: list[tuple[str, int]] = []
    sync = register(app, runs)
    got = {
        await sync.enqueue({"key": "a", "n": n}, key="k", debounce=DEBOUNCE, priority=5)
        for n in range(5)
    }
    assert len(got) == 1
    if backend.raw is not None:
        assert await backend.raw.zcard(f"aqw:{{{backend.queue}}}:delayed:p5") == 1
    assert await drain(app, list(got)) == [4]
    assert runs == [("a", 4)]


# -- a started job is never touched ----------------------------------------------------------


async def test_a_started_job_is_not_touched(backend: Backend) -> None:
    app = backend.app()
    started: list[int] = []
    release = asyncio.Event()

    @app.task(name="slow", keep_result=True)
    async def slow(n: int) -> int:
        started.append(n)
        await release.wait()
        return n

    async with app.worker(concurrency=4):
        first = await slow.enqueue(1, key="k", debounce=0.05)
        await eventually(lambda: started == [1], 10, "the first job's start")
        # a window two enqueues fit in on a loaded machine (0.05 s once did not, on NATS)
        second = await slow.enqueue(2, key="k", debounce=1.0)
        assert second != first and not second.duplicate  # a new job, a new id
        third = await slow.enqueue(3, key="k", debounce=1.0)
        assert third == second and third.duplicate  # which the burst goes on replacing
        info = await app.job(first)
        assert info is not None and info.state == "running"
        await asyncio.sleep(1.5)  # past its debounce: the next job is due
        assert started == [1]  # but waits while the key's earlier job runs
        release.set()
        assert await app.result(first, timeout=20) == 1  # its payload was not replaced
        assert await app.result(second, timeout=20) == 3
    assert sorted(started) == [1, 3]


async def test_a_cancelled_waiting_job_is_not_revived(backend: Backend) -> None:
    app = backend.app()
    runs: list[tuple[str, int]] = []
    sync = register(app, runs)
    first = await sync.enqueue({"key": "a", "n": 1}, key="k", debounce=DEBOUNCE)
    assert await app.cancel(first) == "cancelled"
    second = await sync.enqueue({"key": "a", "n": 2}, key="k", debounce=DEBOUNCE)
    assert second != first and not second.duplicate
    info = await app.job(first)
    assert info is not None and info.state == "cancelled"
    assert await drain(app, [second]) == [2]
    assert runs == [("a", 2)]


# -- several producers -------------------------------------------------------------------------


async def test_concurrent_producers_make_one_job_per_burst(backend: Backend) -> None:
    apps = [backend.app() for _ in range(3)]
    runs: list[tuple[str, int]] = []
    tasks = [register(app, runs) for app in apps]
    got = await asyncio.gather(
        *(tasks[i % 3].enqueue({"key": "a", "n": i}, key="k", debounce=DEBOUNCE) for i in range(60))
    )
    assert len(set(got)) == 1
    assert sum(not e.duplicate for e in got) == 1  # one producer created it, the rest replaced
    (result,) = await drain(apps[0], [got[0]])
    assert runs == [("a", result)] and 0 <= result < 60


# -- bad arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"debounce": 1.0}, "debounce needs key"),
        ({"key": "k", "debounce": 0}, "debounce must be"),
        ({"key": "k", "debounce": -1.0}, "debounce must be"),
        ({"key": "k", "debounce": math.inf}, "debounce must be"),
        ({"key": "k", "debounce": math.nan}, "debounce must be"),
        ({"key": "k", "debounce": True}, "debounce must be"),
        ({"key": "k", "debounce": "1"}, "debounce must be"),
        ({"key": "k", "debounce_max": 2.0}, "debounce_max needs debounce"),
        ({"key": "k", "debounce": 1.0, "debounce_max": 0.5}, "debounce_max must be"),
        ({"key": "k", "debounce": 1.0, "debounce_max": math.inf}, "debounce_max must be"),
        ({"key": "k", "debounce": 1.0, "delay": 1.0}, "debounce cannot be combined with delay"),
        ({"key": "k", "debounce": 1.0, "delay": 0}, "debounce cannot be combined with delay"),
        (
            {"key": "k", "debounce": 1.0, "at": datetime.now(UTC)},
            "debounce cannot be combined with delay= or at=",
        ),
    ],
)
async def test_bad_arguments_name_the_argument(
    backend: Backend, options: dict[str, Any], named: str
) -> None:
    app = backend.app()
    sync = register(app, [])
    with pytest.raises(aqw.ConfigError, match=named):
        await sync.enqueue({"key": "a", "n": 1}, **options)
    assert await depth(app) == (0, 0, 0, 0)  # nothing was written


async def test_debounce_takes_one_payload(backend: Backend) -> None:
    app = backend.app()
    sync = register(app, [])
    with pytest.raises(TypeError):
        await sync.enqueue_many([{"key": "a", "n": 1}], key="k", debounce=1.0)  # type: ignore[call-arg]
    payloads = [{"key": "a", "n": 1}, {"key": "a", "n": 2}]
    with pytest.raises(aqw.ConfigError, match="debounce takes exactly one payload"):
        await app.enqueue(sync, payloads, key="k", debounce=1.0)
    assert await depth(app) == (0, 0, 0, 0)


@pytest.mark.timeout(60)
async def test_sqs_refuses_debounce(monkeypatch: pytest.MonkeyPatch) -> None:
    import aioboto3

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, "testing")
    with moto_server() as endpoint:
        session = aioboto3.Session()
        async with session.client("sqs", region_name="us-east-1", endpoint_url=endpoint) as sqs:
            url = (await sqs.create_queue(QueueName="debounced"))["QueueUrl"]
            app = aqw.App(f"sqs://debounced?region=us-east-1&endpoint_url={endpoint}&wait=1")
            sync = register(app, [])
            try:
                with pytest.raises(aqw.ConfigError, match="debounce needs a broker that can"):
                    await sync.enqueue({"key": "a", "n": 1}, key="k", debounce=1.0)
            finally:
                await app.close()
            names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesDelayed"]
            attrs = await sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)
            assert all(attrs["Attributes"][n] == "0" for n in names)  # nothing was sent


def test_memory_broker_shares_debounce_state_by_queue() -> None:
    a, b = MemoryBroker("shared-debounce"), MemoryBroker("shared-debounce")
    assert a.debounce is b.debounce
