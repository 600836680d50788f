"""Drain rate of aqw's SQS broker against a naive receive-one/delete-one loop, on fauxqs.

moto is too slow under a backlog to measure anything (~6 msg/s with 1,000 waiting), so this
runs fauxqs (npm ``fauxqs@1.9.2``, installed into ``benchmarks/.fauxqs/`` on first use) on a
free loopback port. fauxqs hard-codes ``listen(host="0.0.0.0")``; the small launcher below
rebinds that to 127.0.0.1 before fauxqs starts, so nothing listens beyond this machine.

Per round, each contender gets a fresh queue holding N messages (sent with SendMessageBatch,
20 batches in flight) and drains it:

- ``aqw``: ``aqw.App("sqs://...")`` + a no-op task, ``app.worker(concurrency=100)``: batched
  and concurrent ReceiveMessage calls, leases on visibility, DeleteMessageBatch acks;
- ``naive``: one coroutine, ReceiveMessage(MaxNumberOfMessages=1) then DeleteMessage, repeated.

Contenders alternate within the run (aqw, naive, aqw, naive, ...); the table shows medians.

    python benchmarks/sqs_bench.py [--messages 5000] [--rounds 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import aioboto3  # noqa: E402

import aqw  # noqa: E402
from aqw.job import Job  # noqa: E402

FAUXQS = "fauxqs@1.9.2"
PREFIX = HERE / ".fauxqs"
REGION = "us-east-1"

LAUNCHER = """\
import net from "node:net";
// fauxqs 1.9.2 calls fastify.listen({host: "0.0.0.0"}) with no option to change it:
// keep it on loopback.
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (args[0] && typeof args[0] === "object" && args[0].host === "0.0.0.0") {
    args[0] = { ...args[0], host: "127.0.0.1" };
  } else if (args[1] === "0.0.0.0") {
    args[1] = "127.0.0.1";
  }
  return listen.apply(this, args);
};
const { startFauxqs } = await import("fauxqs");
const server = await startFauxqs({ port: Number(process.argv[2]), logger: false });
console.log(JSON.stringify({ address: server.address, port: server.port }));
const stop = async () => { await server.stop(); process.exit(0); };
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
"""


def ensure_fauxqs() -> None:
    if (PREFIX / "node_modules" / "fauxqs" / "package.json").exists():
        return
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("npm is needed to install fauxqs (apt-get install -y nodejs npm)")
    PREFIX.mkdir(parents=True, exist_ok=True)
    print(f"installing {FAUXQS} into {PREFIX} ...", flush=True)
    subprocess.run(
        [npm, "install", "--prefix", str(PREFIX), FAUXQS, "--no-audit", "--no-fund"],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def fauxqs_server() -> AsyncIterator[str]:
    ensure_fauxqs()
    launcher = PREFIX / "launch.mjs"
    launcher.write_text(LAUNCHER)
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(launcher),
        str(port),
        cwd=str(PREFIX),
        stdout=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        if not line:
            raise SystemExit("fauxqs exited before it started listening")
        info = json.loads(line)
        yield f"http://127.0.0.1:{info['port']}"
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()


async def fill(client: Any, name: str, n: int) -> tuple[str, float]:
    """Create queue ``name`` holding ``n`` aqw jobs; (queue URL, messages sent per second)."""
    url = (await client.create_queue(QueueName=name))["QueueUrl"]
    bodies = [Job(task="noop", payload=i).encode().decode() for i in range(n)]
    batches = [bodies[i : i + 10] for i in range(0, n, 10)]
    gate = asyncio.Semaphore(20)

    async def send(batch: list[str]) -> None:
        async with gate:
            entries = [{"Id": str(i), "MessageBody": b} for i, b in enumerate(batch)]
            reply = await client.send_message_batch(QueueUrl=url, Entries=entries)
            assert not reply.get("Failed"), reply["Failed"]

    t0 = time.perf_counter()
    await asyncio.gather(*(send(b) for b in batches))
    return url, n / (time.perf_counter() - t0)


async def drain_aqw(endpoint: str, name: str, n: int, concurrency: int) -> float:
    app = aqw.App(f"sqs://{name}?region={REGION}&endpoint_url={endpoint}&dlq={name}-dead&create=1")
    done = 0
    finished = asyncio.Event()

    @app.task(name="noop")
    async def noop(i: int) -> None:
        nonlocal done
        done += 1
        if done >= n:
            finished.set()

    t0 = time.perf_counter()
    async with app.worker(concurrency=concurrency, grace=5) as worker:
        await finished.wait()
        await wait_for_acks(worker, n)
        elapsed = time.perf_counter() - t0
    await app.close()
    return n / elapsed


async def wait_for_acks(worker: aqw.Worker, n: int) -> None:
    """The last handlers returned; their DeleteMessageBatch calls are still in flight."""
    while worker.stats.processed < n:  # noqa: ASYNC110 - a counter, not an event
        await asyncio.sleep(0.001)


async def drain_naive(client: Any, url: str, n: int) -> float:
    t0 = time.perf_counter()
    got = 0
    while got < n:
        reply = await client.receive_message(QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=1)
        for msg in reply.get("Messages", []):
            await client.delete_message(QueueUrl=url, ReceiptHandle=msg["ReceiptHandle"])
            got += 1
    return n / (time.perf_counter() - t0)


async def remaining(client: Any, url: str) -> int:
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attrs = (await client.get_queue_attributes(QueueUrl=url, AttributeNames=names))["Attributes"]
    return sum(int(attrs.get(k, 0)) for k in names)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args()
    for key, value in {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        os.environ.setdefault(key, value)

    results: dict[str, list[float]] = {"aqw": [], "naive": []}
    enqueue: list[float] = []
    async with fauxqs_server() as endpoint:
        session = aioboto3.Session()
        async with session.client("sqs", region_name=REGION, endpoint_url=endpoint) as client:
            contenders: dict[str, Callable[[str, str], Awaitable[float]]] = {
                "aqw": lambda name, url: drain_aqw(endpoint, name, args.messages, args.concurrency),
                "naive": lambda name, url: drain_naive(client, url, args.messages),
            }
            for r in range(args.rounds):
                for label, drain in contenders.items():
                    name = f"bench-{label}-{r}"
                    url, sent = await fill(client, name, args.messages)
                    enqueue.append(sent)
                    rate = await drain(name, url)
                    left = await remaining(client, url)
                    assert left == 0, f"{label}: {left} messages left on {name}"
                    results[label].append(rate)
                    print(f"round {r + 1} {label:>5}: {rate:8.0f} msg/s", flush=True)

    summary = {
        "server": FAUXQS,
        "messages": args.messages,
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        "enqueue_msgs_per_s": round(statistics.median(enqueue)),
        "drain_msgs_per_s": {k: round(statistics.median(v)) for k, v in results.items()},
        "runs": {k: [round(x) for x in v] for k, v in results.items()},
    }
    speedup = summary["drain_msgs_per_s"]["aqw"] / max(1, summary["drain_msgs_per_s"]["naive"])
    summary["speedup"] = round(speedup, 1)
    print()
    print(f"{'contender':<44} {'drain msg/s':>12}")
    print(
        f"{'aqw SQSBroker, concurrency ' + str(args.concurrency):<44} "
        f"{summary['drain_msgs_per_s']['aqw']:>12}"
    )
    print(f"{'naive receive(1) + delete loop':<44} {summary['drain_msgs_per_s']['naive']:>12}")
    print(f"{'speedup':<44} {summary['speedup']:>11}x")
    print(f"(SendMessageBatch fill: {summary['enqueue_msgs_per_s']} msg/s)")
    print(json.dumps(summary))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
