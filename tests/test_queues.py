"""One worker on several queues (``aqw/brokers/multi.py``, ``app.worker(queues=...)``):
routing by task option and per call, strict order, weights, each queue's own DLQ, crash
recovery over two queues, the ``--queues`` option, and ``aqw status --queue`` listing the
worker. On memory, fakeredis and the real Redis, except where noted."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Backend
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from redis.asyncio import Redis

import aqw
from aqw.brokers.multi import MultiBroker, queue_plan
from aqw.brokers.redis import RedisBroker
from aqw.cli._main import build_parser
from aqw.cli._status import add_parser, run
from aqw.cli._worker import parse_queues
from aqw.cli.supervisor import worker_argv
from aqw.job import Job
from tests._helpers import REDIS_URL, eventually, moto_server

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}

pytestmark = pytest.mark.timeout(60)

NO_RETRY = aqw.RetryPolicy(max_retries=0, base=0.01, cap=0.01)


def three(backend: Backend, queue_names: Callable[[], str]) -> tuple[aqw.App, list[str]]:
    """An app on the backend's queue (``default``) and two more queues: [high, default, low]."""
    return backend.app(retry=NO_RETRY), [queue_names(), backend.queue, queue_names()]


async def run_until(app: aqw.App, count: Callable[[], int], n: int, **options: Any) -> None:
    async with app.worker(**options):
        await eventually(lambda: count() >= n, 30, f"{n} jobs run")


# -- routing ----------------------------------------------------------------------------------


async def test_jobs_go_to_the_task_queue_or_the_one_an_enqueue_names(
    backend: Backend, queue_names: Callable[[], str]
) -> None:
    app, (high, default, low) = three(backend, queue_names)

    @app.task(queue=high)
    async def urgent(n: int) -> None:
        return None

    @app.task(name="plain")
    async def plain(n: int) -> None:
        return None

    await urgent.enqueue(1)
    await plain.enqueue(2)
    await plain.enqueue(3, queue=low)
    await urgent.enqueue_many([4, 5], queue=default)
    await app.enqueue("plain", [6], queue=high)
    assert app.broker_for(default) is app.broker
    assert app.broker_for(high) is app.broker_for(high)  # built once
    waiting = {q: (await app.broker_for(q).depth()).waiting for q in (high, default, low)}
    assert waiting == {high: 2, default: 3, low: 1}


async def test_bad_queue_names_are_config_errors_naming_queue(backend: Backend) -> None:
    app = backend.app()
    with pytest.raises(aqw.ConfigError, match="queue"):
        app.task(queue="has space")(_noop)

    @app.task
    async def plain(n: int) -> None:
        return None

    for bad in ("{x}", "", 5):
        with pytest.raises(aqw.ConfigError, match="queue"):
            await plain.enqueue(1, queue=bad)  # type: ignore[arg-type]
    assert (await app.broker.depth()).waiting == 0
    for queues in ([], ["a", "a"], {"a": 0}, {"a": -1.0}, {"a": True}, "a,b", ["a b"]):
        with pytest.raises(aqw.ConfigError, match="queues"):
            app.worker(queues=queues)  # type: ignore[arg-type]


async def _noop() -> None:
    return None


# -- order and weights ------------------------------------------------------------------------


async def test_strict_order_runs_every_earlier_queue_job_first(
    backend: Backend, queue_names: Callable[[], str]
) -> None:
    app, queues = three(backend, queue_names)
    ran: list[str] = []

    @app.task
    async def job(queue: str) -> None:
        ran.append(queue)

    for _ in range(8):  # interleaved, lowest first: order comes from the queues alone
        for queue in reversed(queues):
            await job.enqueue(queue, queue=queue)
    await run_until(app, lambda: len(ran), 24, concurrency=1, queues=queues)
    assert ran == [q for q in queues for _ in range(8)]


async def test_weights_split_the_starts_when_every_queue_has_work(
    backend: Backend, queue_names: Callable[[], str]
) -> None:
    app, queues = three(backend, queue_names)
    ran: list[str] = []

    @app.task
    async def job(queue: str) -> None:
        ran.append(queue)

    for queue in queues:
        await job.enqueue_many([queue] * 40, queue=queue)
    weights = dict(zip(queues, (5, 3, 1), strict=True))
    await run_until(app, lambda: len(ran), 36, concurrency=1, queues=weights)
    first = ran[:36]
    high, default, low = (first.count(q) for q in queues)
    assert 14 <= high <= 26 and 8 <= default <= 16 and 1 <= low <= 8, (high, default, low)


async def test_an_idle_queue_share_goes_to_the_others(
    backend: Backend, queue_names: Callable[[], str]
) -> None:
    app, (high, _, low) = three(backend, queue_names)
    ran: list[str] = []

    @app.task
    async def job(queue: str) -> None:
        ran.append(queue)

    await job.enqueue_many([low] * 12, queue=low)
    await run_until(app, lambda: len(ran), 12, concurrency=1, queues={high: 9, low: 1})
    assert ran == [low] * 12


# -- per queue: DLQ, telemetry, status --------------------------------------------------------


async def test_each_queue_dead_letters_into_its_own_dlq(
    backend: Backend, queue_names: Callable[[], str]
) -> None:
    app, (high, _, low) = three(backend, queue_names)

    @app.task
    async def fails(queue: str) -> None:
        raise aqw.Reject(f"no {queue}")

    await fails.enqueue(high, queue=high)
    await fails.enqueue_many([low, low], queue=low)

    async with app.worker(concurrency=4, queues=[high, low]):
        await eventually(lambda: _count_dead(app, high, low, 3), 30, "3 dead jobs")
    assert [d.error for d in await app.broker_for(high).dlq_list()] == [f"Reject: no {high}"]
    assert [d.error for d in await app.broker_for(low).dlq_list()] == [f"Reject: no {low}"] * 2
    assert await app.broker.dlq_list() == []


async def _count_dead(app: aqw.App, a: str, b: str, n: int) -> bool:
    found = sum([len(await app.broker_for(q).dlq_list()) for q in (a, b)])
    return found >= n


async def test_process_spans_name_the_job_queue(
    backend: Backend, queue_names: Callable[[], str]
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = backend.app(tracer_provider=provider)
    high, low = queue_names(), queue_names()
    done: list[int] = []

    @app.task
    async def job(n: int) -> None:
        done.append(n)

    await job.enqueue(1, queue=high)
    await job.enqueue(2, queue=low)
    await run_until(app, lambda: len(done), 2, queues=[high, low])
    process = [s for s in exporter.get_finished_spans() if s.name.startswith("process ")]
    names = sorted(s.name for s in process)
    assert names == sorted([f"process {high}", f"process {low}"])
    for span in process:
        assert span.attributes is not None
        assert span.name == f"process {span.attributes['messaging.destination.name']}"


def status_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="aqw")
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["status", *argv])


@pytest.mark.parametrize("kind", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def test_aqw_status_of_each_queue_lists_the_worker(
    kind: str, queue_names: Callable[[], str], capsys: pytest.CaptureFixture[str]
) -> None:
    url = "memory://" if kind == "memory" else REDIS_URL
    high, low = queue_names(), queue_names()
    app = aqw.App(url, queue=queue_names())

    @app.task
    async def job(n: int) -> None:
        return None

    try:
        async with app.worker(queues=[high, low], heartbeat=0.1) as worker:

            async def listed(queue: str) -> bool:
                assert await run(status_args("--broker", url, "--queue", queue, "--json")) == 0
                data = json.loads(capsys.readouterr().out)
                return worker.name in [w.get("worker") for w in data["workers"]]

            for queue in (high, low):
                await eventually(lambda q=queue: listed(q), 20, f"the worker in {queue}")  # type: ignore[misc]
    finally:
        await app.close()


# -- crash recovery over two queues (real Redis) ----------------------------------------------

CRASH_SCRIPT = """
import asyncio, os, sys
from redis.asyncio import Redis
import aqw

url, home, high, low, ledger = sys.argv[1:6]
stage = sys.argv[6]  # "first": each job blocks (to be SIGKILLed); "second": each completes


async def main() -> None:
    r = Redis.from_url(url)
    app = aqw.App(url, queue=home, lease_ttl=1.0)

    @app.task(name="job")
    async def job(n: int, ctx: aqw.Context) -> None:
        await r.rpush(ledger + ":started", f"{n} {stage}")
        if stage == "first":
            await asyncio.sleep(3600)
        await r.rpush(ledger, f"{n} {ctx.job_id}")

    if stage == "enqueue":
        await job.enqueue(1, queue=high)
        await job.enqueue(2, queue=low)
        return
    async with app.worker(concurrency=4, queues=[high, low], grace=1.0):
        print("ready", flush=True)
        await asyncio.sleep(3600 if stage == "first" else 15)


asyncio.run(main())
"""


@pytest.mark.redis
async def test_jobs_of_a_sigkilled_two_queue_worker_are_recovered_once(
    redis_url: str,
    queue_names: Callable[[], str],
    tmp_path: Path,
    subprocess_env: dict[str, str],
    repo_root: Path,
) -> None:
    home, high, low = queue_names(), queue_names(), queue_names()
    ledger = f"aqw:{{{home}}}:ledger"
    script = tmp_path / "two_queue_worker.py"
    script.write_text(CRASH_SCRIPT)
    client = Redis.from_url(redis_url)

    async def spawn(stage: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *(sys.executable, str(script), redis_url, home, high, low, ledger, stage),
            cwd=repo_root,
            env=subprocess_env,
            stdout=asyncio.subprocess.DEVNULL,
        )

    try:
        assert await (await spawn("enqueue")).wait() == 0
        first = await spawn("first")

        async def started(stage: str) -> bool:
            entries = [e.decode() for e in await client.lrange(ledger + ":started", 0, -1)]
            return sorted(e for e in entries if e.endswith(stage)) == [
                f"1 {stage}",
                f"2 {stage}",
            ]

        await eventually(lambda: started("first"), 30, "both jobs started", procs=[first])
        first.send_signal(signal.SIGKILL)
        assert await first.wait() == -signal.SIGKILL
        assert await client.llen(ledger) == 0

        second = await spawn("second")

        async def both_done() -> bool:
            return int(await client.llen(ledger)) >= 2

        await eventually(both_done, 30, "both jobs recovered", procs=[second])
        await asyncio.sleep(1.5)  # a second completion would show up here
        second.send_signal(signal.SIGTERM)
        await second.wait()
        done = sorted(e.decode().split()[0] for e in await client.lrange(ledger, 0, -1))
        assert done == ["1", "2"]  # each once, to completion
        for queue in (high, low):
            depth = await RedisBroker(client, queue).depth()
            assert (depth.waiting, depth.in_flight, depth.dead) == (0, 0, 0)
    finally:
        await client.delete(ledger, ledger + ":started")
        await client.aclose()


# -- the command line -------------------------------------------------------------------------


def test_queues_option_parses_order_and_weights() -> None:
    assert parse_queues("high,default,low") == ["high", "default", "low"]
    assert parse_queues("high=5, default=3,low=1") == {"high": 5.0, "default": 3.0, "low": 1.0}
    assert queue_plan(parse_queues("a=2,b=0.5")).weights == (2.0, 0.5)
    for bad in ("", "a,a", "a=1,a=2", "a=0", "a=-1", "a=5,b", "a=x", "a b", "a,{b}"):
        with pytest.raises(aqw.ConfigError, match="queues"):
            parse_queues(bad)


def test_aqw_worker_takes_queues_and_passes_them_to_each_process(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser().parse_args(["worker", "m:app", "--queues", "high=5,low=1", "-p", "2"])
    assert args.queues == "high=5,low=1"
    assert worker_argv(args)[-2:] == ["--queues", "high=5,low=1"]
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["worker", "m:app", "--queues", "a,a"])
    assert exit_.value.code == 2
    assert "queues: 'a' is named twice" in capsys.readouterr().err


def test_the_sqs_broker_of_another_queue_keeps_the_options_but_the_dlq_name() -> None:
    pytest.importorskip("aioboto3")
    from aqw.brokers.sqs import SQSBroker

    jobs = SQSBroker.from_url("sqs://jobs?region=eu-west-1&dlq=jobs-dead&wait=3", "jobs")
    low = jobs.sibling("low")
    assert (low.queue, low.region, low.wait, low.dlq_name) == ("low", "eu-west-1", 3, None)
    by_url = SQSBroker.from_url("sqs://https://h/1/jobs?dlq=none", "jobs").sibling("low")
    assert (by_url.queue_url, by_url.dlq_name) == ("https://h/1/low", "none")


async def test_a_multi_broker_routes_settles_to_the_delivery_queue(
    backend: Backend, queue_names: Callable[[], str]
) -> None:
    app = backend.app()
    a, b = queue_names(), queue_names()
    multi = MultiBroker({a: app.broker_for(a), b: app.broker_for(b)}, home=app.broker)
    await multi.connect()
    await multi.start_consuming("c1")
    job = Job(task="t", payload=1)
    await app.broker_for(b).publish([job])
    [delivery] = await multi.fetch(10, block=0.5)
    assert multi.broker_of(delivery) is app.broker_for(b)
    assert await multi.ack(delivery, job, None)
    assert (await app.broker_for(b).depth()).in_flight == 0
    assert await multi.fetch(10, block=0.2) == []


async def test_one_fetch_fills_from_the_next_queues_without_waiting(
    backend: Backend, queue_names: Callable[[], str]
) -> None:
    app = backend.app()
    a, b, c = queue_names(), queue_names(), queue_names()
    brokers = {q: app.broker_for(q) for q in (a, b, c)}
    await brokers[b].publish([Job(task="t", payload=i) for i in range(3)])
    await brokers[c].publish([Job(task="t", payload=i) for i in range(20)])
    for weights in (None, (9.0, 5.0, 1.0)):
        multi = MultiBroker(brokers, weights, home=app.broker)
        await multi.connect()
        await multi.start_consuming(f"c-{weights}")
        got = await multi.fetch(10, block=0)  # a, the heaviest, is idle: its share goes on
        assert len(got) == 10
        if weights is None:  # strict: all of b before any of c
            assert [multi.broker_of(d) for d in got[:3]] == [brokers[b]] * 3
        for delivery in got:
            assert await multi.ack(delivery, None, None)


async def test_sqs_queues_in_strict_order(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in AWS_ENV.items():
        monkeypatch.setenv(name, value)
    with moto_server() as endpoint:
        url = f"sqs://mq-a?region=us-east-1&endpoint_url={endpoint}&create=1&dlq=none&wait=0"
        app = aqw.App(url)
        ran: list[str] = []

        @app.task(queue="mq-b")
        async def first(n: int) -> None:
            ran.append("mq-b")

        @app.task
        async def second(n: int) -> None:
            ran.append("mq-a")

        try:
            assert app.queue == "mq-a" and app.broker_for("mq-b").queue == "mq-b"
            await second.enqueue_many([1, 2])
            await first.enqueue_many([1, 2])
            await run_until(app, lambda: len(ran), 4, concurrency=1, queues=["mq-b", "mq-a"])
            assert ran == ["mq-b", "mq-b", "mq-a", "mq-a"]
        finally:
            await app.close()


# -- waiting ----------------------------------------------------------------------------------


async def test_an_idle_worker_wakes_at_once_for_a_job_in_any_queue(
    redis_backend: Backend, queue_names: Callable[[], str]
) -> None:
    """Redis queues on one server: one blocking read over all of them, so a job in the last
    of five queues starts at once (waiting on each in turn for 50 ms would take ~100 ms)."""
    app = redis_backend.app()
    names = [redis_backend.queue, *(queue_names() for _ in range(4))]
    started: dict[int, float] = {}

    @app.task(queue=names[-1])
    async def last(n: int) -> None:
        started[n] = asyncio.get_running_loop().time()

    waits = []
    async with app.worker(queues=names, concurrency=2):
        await asyncio.sleep(0.3)  # idle, in its blocking read
        for n in range(7):
            sent = asyncio.get_running_loop().time()
            await last.enqueue(n)
            await eventually(lambda n=n: n in started, 10, "the job to start")
            waits.append(started[n] - sent)
            await asyncio.sleep(0.05)  # back in the read
    waits.sort()
    assert waits[len(waits) // 2] < 0.04, waits
