"""A worker frozen past its leases, again and again, starts nothing that has ended.

Two worker processes (tests/stale_worker.py) on the real Redis run plain, rate-limited,
capped and debounced jobs, all with a 1 s lease; one of them holds a full fetch buffer and is
frozen (SIGSTOP) for 2.5 s, ``FREEZES`` times, while it holds jobs, the other one taking its
deliveries over meanwhile. Each round enqueues a mixed batch first, so the frozen worker
always holds each kind. At the end:

- every job wrote its effect, and every job's record has ended (no record stuck ``running``);
- no run started after its job's end (its start rewrote a record that had ended) and no
  effect was accepted after it, by a fenced ledger (an effect whose fencing token is not above
  the last accepted one is refused, as a datastore does it);
- the thawed worker refused its stale starts (``stale_starts`` in its stats).

A frozen holder can resume between any check and its next write: its late write is refused by
the fence (its token is below the next holder's), counted by the ledger, and not a failure. A
second accepted effect is allowed only from a run whose holder never settled (frozen between
its effect and its ack: at least once), and then with a greater fencing token.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from stale_worker import CAP_KEYS, ledger_keys, make_app

from aqw.brokers.redis import RedisBroker
from aqw.record import FINAL_STATES
from tests._helpers import eventually

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

FREEZES = 3  # again and again: each freeze is a fresh chance for a stale start
FREEZE = 2.5  # seconds frozen: past the 1 s lease, and past the takeover after it
GAP = 1.2  # seconds running between freezes
#: Per round: plain, rate-limited, capped and debounced jobs.
ROUND = (200, 60, 60, 40)

Proc = asyncio.subprocess.Process


async def start_worker(
    queue: str, concurrency: int, prefetch: int, root: Path, env: dict[str, str], log: Any
) -> Proc:
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, str(root / "tests" / "stale_worker.py"), queue),
        *(str(concurrency), str(prefetch)),
        cwd=root,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
    )
    assert proc.stdout is not None
    ready = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert ready.startswith(b"ready"), ready
    return proc


async def stop_worker(proc: Proc) -> dict[str, int]:
    """SIGTERM, then the stats the worker printed as it stopped."""
    assert proc.stdout is not None
    proc.send_signal(signal.SIGTERM)
    out = await asyncio.wait_for(proc.stdout.read(), 30)
    assert await asyncio.wait_for(proc.wait(), 30) == 0, out
    line = next(x for x in out.decode().splitlines() if x.startswith("stopped "))
    stats: dict[str, int] = ast.literal_eval(line.removeprefix("stopped "))
    return stats


@pytest.mark.xdist_group("processes")  # see CONTRIBUTING.md: one at a time
async def test_a_worker_frozen_again_and_again_starts_nothing_that_ended(
    redis_url: str, queue_name: str, repo_root: Path, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    client = Redis.from_url(redis_url)
    producer = make_app(queue_name)
    broker = producer.broker
    assert isinstance(broker, RedisBroker)
    counters, effects, late = ledger_keys(queue_name)
    procs: list[Proc] = []
    ids: set[str] = set()
    logs = [(tmp_path / f"worker-{i}.log").open("wb") for i in range(2)]
    try:
        victim = await start_worker(queue_name, 8, 32, repo_root, subprocess_env, logs[0])
        procs.append(victim)
        procs.append(await start_worker(queue_name, 8, 8, repo_root, subprocess_env, logs[1]))
        tasks = producer.tasks

        async def victim_holds() -> bool:
            summary = await client.xpending(broker.keys.stream, "aqw")
            return any(
                f"-{victim.pid}-" in c["name"].decode() and int(c["pending"]) > 0
                for c in summary["consumers"]
            )

        held_at_freeze = 0
        for r in range(FREEZES):
            plain, limited, capped, debounced = ROUND
            ids |= {str(i) for i in await tasks["plain"].enqueue_many(list(range(plain)))}
            ids |= {str(i) for i in await tasks["limited"].enqueue_many(list(range(limited)))}
            caps = [{"k": f"k{n % CAP_KEYS}", "n": n} for n in range(capped)]
            ids |= {str(i) for i in await tasks["capped"].enqueue_many(caps)}
            for n in range(debounced):  # a burst of two per key: one job each
                for _ in range(2):
                    got = await tasks["debounced"].enqueue(n, key=f"r{r}-{n}", debounce=0.2)
                ids.add(str(got))
            with contextlib.suppress(AssertionError):
                await eventually(victim_holds, 3, "the frozen worker to hold jobs", interval=0.01)
                held_at_freeze += 1
            os.kill(victim.pid, signal.SIGSTOP)
            await asyncio.sleep(FREEZE)
            os.kill(victim.pid, signal.SIGCONT)
            await asyncio.sleep(GAP)
        assert held_at_freeze >= FREEZES - 1, "the frozen worker held no jobs: nothing tested"

        async def all_effects() -> bool:
            return int(await client.hlen(effects)) >= len(ids)

        await eventually(all_effects, 40, "every job's effect", procs=procs, interval=0.05)

        async def states() -> list[str | None]:
            pipe = client.pipeline(transaction=False)
            for i in ids:
                pipe.hget(broker.keys.record(i), "state")
            return [s.decode() if s is not None else None for s in await pipe.execute()]

        async def all_ended() -> bool:
            return all(s in FINAL_STATES for s in await states())

        await eventually(all_ended, 20, "every record to end", procs=procs, interval=0.1)
        stats = [await stop_worker(p) for p in procs]
        procs.clear()

        tally = {k.decode(): int(v) for k, v in (await client.hgetall(counters)).items()}
        cases = [c.decode() for c in await client.lrange(late, 0, -1)]
        written = {k.decode() for k in await client.hkeys(effects)}
        assert written == ids  # every job ran, and only those
        assert tally.get("starts_after_end", 0) == 0, (tally, cases)
        assert tally.get("effects_after_end", 0) == 0, (tally, cases)
        assert set(await states()) == {"succeeded"}, stats
        assert int((await client.xpending(broker.keys.stream, "aqw"))["pending"]) == 0
        assert stats[0]["stale_starts"] > 0, stats  # the thawed worker had stale starts
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 10)
        for log in logs:
            log.close()
        await producer.close()
        await client.aclose()
