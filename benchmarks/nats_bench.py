"""aqw's NATS JetStream broker against a raw nats-py pull loop, in one run, on the server
at ``--url`` (default the local nats-server on 4222): each contender on a fresh stream.

- drain: N no-op jobs published first, then drained (aqw: ``app.worker(concurrency=100)``,
  burst; raw: ``fetch(100)`` and an ack per message, one coroutine);
- enqueue: single awaited enqueues per second (aqw: ``task.enqueue``; raw: ``js.publish``);
- latency: p50/p99 from enqueue to the handler at 500 jobs/s, the producer in its own
  process (``--produce``), the consumer already waiting.

Contenders alternate within the run; the table shows medians of ``--rounds``.

    python benchmarks/nats_bench.py [--jobs 5000] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import nats  # noqa: E402

import aqw  # noqa: E402
from aqw.brokers.nats._layout import Layout  # noqa: E402
from aqw.job import Job  # noqa: E402


async def _drop(url: str, streams: list[str], buckets: Sequence[str] = ()) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    for s in streams:
        with contextlib.suppress(Exception):
            await js.delete_stream(s)
    for b in buckets:
        with contextlib.suppress(Exception):
            await js.delete_key_value(b)
    await nc.close()


def _aqw_names(queue: str) -> tuple[list[str], list[str]]:
    n = Layout(queue)
    return (
        [n.stream, n.delayed_stream, n.dlq_stream],
        [n.leases_bucket, n.keys_bucket, n.state_bucket, n.records_bucket],
    )


async def raw_stream(url: str) -> tuple[Any, Any, str]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    name = f"RAW_{uuid.uuid4().hex[:8]}"
    await js.add_stream(name=name, subjects=[f"{name}.jobs"], retention="workqueue")
    return nc, js, name


async def drain_raw(url: str, n: int) -> float:
    nc, js, name = await raw_stream(url)
    await asyncio.gather(*(js.publish(f"{name}.jobs", b"{}") for _ in range(n)))
    sub = await js.pull_subscribe(f"{name}.jobs", durable="raw", stream=name)
    start, done = time.perf_counter(), 0
    while done < n:
        try:
            msgs = await sub.fetch(100, timeout=1)
        except TimeoutError:
            continue
        for m in msgs:
            await m.ack()
        done += len(msgs)
    rate = n / (time.perf_counter() - start)
    await js.delete_stream(name)
    await nc.close()
    return rate


async def drain_aqw(url: str, n: int) -> float:
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    app = aqw.App(f"{url}?queue={queue}")

    @app.task(name="noop")
    async def noop() -> None:
        return None

    jobs = [Job(task="noop") for _ in range(n)]
    for i in range(0, n, 1000):
        await app.broker.publish(jobs[i : i + 1000])
    start = time.perf_counter()
    await app.worker(concurrency=100, burst=True).run()
    rate = n / (time.perf_counter() - start)
    await app.close()
    await _drop(url, *_aqw_names(queue))
    return rate


async def enqueue_raw(url: str, n: int) -> float:
    nc, js, name = await raw_stream(url)
    start = time.perf_counter()
    for _ in range(n):
        await js.publish(f"{name}.jobs", b"{}")
    rate = n / (time.perf_counter() - start)
    await js.delete_stream(name)
    await nc.close()
    return rate


async def enqueue_aqw(url: str, n: int) -> float:
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    app = aqw.App(f"{url}?queue={queue}")

    @app.task(name="noop")
    async def noop() -> None:
        return None

    await noop.enqueue()  # connect first
    start = time.perf_counter()
    for _ in range(n):
        await noop.enqueue()
    rate = n / (time.perf_counter() - start)
    await app.close()
    await _drop(url, *_aqw_names(queue))
    return rate


def _percentiles(lat: list[float]) -> tuple[float, float]:
    lat.sort()
    return lat[len(lat) // 2] * 1000, lat[int(len(lat) * 0.99)] * 1000


async def latency(url: str, kind: str, rate: int, seconds: float) -> tuple[float, float]:
    total = int(rate * seconds)
    got: list[float] = []
    done = asyncio.Event()
    if kind == "raw":
        nc, js, name = await raw_stream(url)
        target = name
        sub = await js.pull_subscribe(f"{name}.jobs", durable="raw", stream=name)

        async def consume() -> None:
            while len(got) < total:
                try:
                    msgs = await sub.fetch(100, timeout=1)
                except TimeoutError:
                    continue
                for m in msgs:
                    got.append(time.time() - float(m.data))
                    await m.ack()
            done.set()

        runner: Any = asyncio.create_task(consume())
    else:
        target = f"bench-{uuid.uuid4().hex[:8]}"
        app = aqw.App(f"{url}?queue={target}")

        @app.task(name="stamp")
        async def stamp(at: float) -> None:
            got.append(time.time() - at)
            if len(got) >= total:
                done.set()

        worker = app.worker(concurrency=100)
        runner = asyncio.create_task(worker.run())
        await app.broker.connect()
    await asyncio.sleep(0.5)
    producer = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--produce", kind, url, target, str(rate), str(seconds)
    )
    await asyncio.wait_for(done.wait(), seconds + 60)
    await producer.wait()
    if kind == "raw":
        runner.cancel()
        await js.delete_stream(target)
        await nc.close()
    else:
        await worker.stop()
        await runner
        await app.close()
        await _drop(url, *_aqw_names(target))
    return _percentiles(got)


async def produce(kind: str, url: str, target: str, rate: int, seconds: float) -> None:
    total = int(rate * seconds)
    if kind == "raw":
        nc = await nats.connect(url)
        js = nc.jetstream()

        async def send() -> None:
            await js.publish(f"{target}.jobs", repr(time.time()).encode())
    else:
        app = aqw.App(f"{url}?queue={target}")
        await app.broker.connect()

        async def send() -> None:
            await app.broker.publish([Job(task="stamp", payload=time.time())])

    start = time.perf_counter()
    for i in range(total):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await send()


async def main(a: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, dict[str, list[float]]] = {"aqw": {}, "raw": {}}
    for _ in range(a.rounds):
        for kind in ("aqw", "raw"):
            row = out[kind]
            drain = drain_aqw if kind == "aqw" else drain_raw
            enqueue = enqueue_aqw if kind == "aqw" else enqueue_raw
            row.setdefault("drain/s", []).append(await drain(a.url, a.jobs))
            row.setdefault("enqueue/s", []).append(await enqueue(a.url, 1000))
            p50, p99 = await latency(a.url, kind, 500, 4.0)
            row.setdefault("p50 ms", []).append(p50)
            row.setdefault("p99 ms", []).append(p99)
    medians = {k: {m: statistics.median(v) for m, v in r.items()} for k, r in out.items()}
    print(f"{'':6} {'drain/s':>10} {'enqueue/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
    for kind, r in medians.items():
        print(
            f"{kind:6} {r['drain/s']:10.0f} {r['enqueue/s']:10.0f} "
            f"{r['p50 ms']:8.2f} {r['p99 ms']:8.2f}"
        )
    return {"rounds": out, "medians": medians}


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--produce":
        kind, url, target, rate, seconds = sys.argv[2:7]
        asyncio.run(produce(kind, url, target, int(rate), float(seconds)))
    else:
        p = argparse.ArgumentParser()
        p.add_argument("--url", default="nats://127.0.0.1:4222")
        p.add_argument("--jobs", type=int, default=5000)
        p.add_argument("--rounds", type=int, default=3)
        p.add_argument("--json")
        args = p.parse_args()
        result = asyncio.run(main(args))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))
