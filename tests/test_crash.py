"""Crash recovery on the real Redis: three worker processes, one SIGKILLed mid-run.

Every job records its completion in a fenced ledger (see tests/crash_worker.py). At the end
every job is recorded; a job has two records only if the killed worker was running it (it
wrote, then died before its ack), and then the records carry distinct, increasing fencing
tokens; no stale write was ever attempted; the stream and its pending list are empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from crash_worker import ledger_keys, make_app
from redis.asyncio import Redis

from aqw.brokers.redis import RedisBroker
from tests._helpers import eventually
from tests._spawn import Forked, spawn_script

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

JOBS = 2000
WORKERS = 3
CONCURRENCY = 8


Proc = Forked

#: The exit of the worker the test kills; any other exit of a worker fails the test at once.
KILLED = (-signal.SIGKILL,)


async def test_sigkilled_worker_loses_nothing_and_fencing_holds(
    redis_url: str, queue_name: str, repo_root: Path, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    client = Redis.from_url(redis_url)
    producer = make_app(queue_name)
    procs: list[Proc] = []
    logs = []
    ledger, top, refused = ledger_keys(queue_name)
    try:
        ids = [str(i) for i in await producer.tasks["record"].enqueue_many(list(range(JOBS)))]
        assert len(set(ids)) == JOBS
        broker = producer.broker
        assert isinstance(broker, RedisBroker)
        stream = broker.keys.stream

        for i in range(WORKERS):
            log = (tmp_path / f"worker-{i}.log").open("wb")
            logs.append(log)
            script = str(repo_root / "tests" / "crash_worker.py")
            proc = await spawn_script(
                script, queue_name, CONCURRENCY, cwd=repo_root, env=subprocess_env, log=log
            )
            procs.append(proc)

        async def a_third_done() -> bool:
            return int(await client.hlen(top)) >= JOBS // 3

        await eventually(
            a_third_done,
            45,
            "a third of the jobs",
            procs=procs,
            allowed_exits=KILLED,
            interval=0.02,
        )

        async def holding() -> list[Proc]:
            """The workers holding entries right now (on a loaded machine a worker may start
            late and hold nothing yet): the victim is one of them, or nothing is tested."""
            pending = (await client.xpending(stream, "aqw"))["consumers"]
            names = [c["name"].decode() for c in pending if int(c["pending"]) > 0]
            return [p for p in procs if any(f"-{p.pid}-" in n for n in names)]

        victim = (await eventually(holding, 20, "a worker holding jobs", interval=0.01))[0]
        victim.send_signal(signal.SIGKILL)
        await asyncio.wait_for(victim.wait(), 10)
        killed_at = time.monotonic()
        summary = await client.xpending(stream, "aqw")
        orphaned = sum(
            int(c["pending"])
            for c in summary["consumers"]
            if f"-{victim.pid}-" in c["name"].decode()
        )
        # at most its running jobs and as many more whose settles were on their way
        # (``worker/_slots.py``: a settling job's slot takes the next job)
        assert orphaned > 0, "the victim held no jobs when killed: nothing tested"
        assert orphaned <= 2 * CONCURRENCY, f"the victim held {orphaned} deliveries"

        async def all_done() -> bool:
            return int(await client.hlen(top)) >= JOBS

        await eventually(
            all_done,
            60,
            "every job in the ledger",
            procs=procs,
            allowed_exits=KILLED,
            interval=0.02,
        )
        recovered_after = time.monotonic() - killed_at

        async def drained() -> bool:
            return int((await client.xpending(stream, "aqw"))["pending"]) == 0

        await eventually(
            drained,
            15,
            "the pending list to drain",
            procs=procs,
            allowed_exits=KILLED,
            interval=0.02,
        )
        survivors = [p for p in procs if p is not victim]
        for proc in survivors:
            proc.send_signal(signal.SIGTERM)
        for proc in survivors:
            code = await asyncio.wait_for(proc.wait(), 20)
            assert code == 0, f"worker {proc.pid} did not stop cleanly"

        # -- the ledger ------------------------------------------------------------------------
        records: dict[str, list[tuple[int, int]]] = defaultdict(list)
        entries: list[Any] = await client.lrange(ledger, 0, -1)
        for raw in entries:
            job_id, fence, pid = raw.decode().split()
            records[job_id].append((int(fence), int(pid)))
        assert set(records) == set(ids), "a job was never completed"
        assert int(await client.get(refused) or 0) == 0, "a stale holder tried a late write"
        repeated = {job: recs for job, recs in records.items() if len(recs) > 1}
        for job, recs in records.items():
            fences = [fence for fence, _ in recs]
            assert all(a < b for a, b in itertools.pairwise(fences)), (job, recs)
            assert all(fence > 0 for fence in fences)
        # a second record only for a job the killed worker had written and not yet acked
        assert len(repeated) <= orphaned, repeated
        for job, recs in repeated.items():
            assert len(recs) == 2, (job, recs)
            assert recs[0][1] == victim.pid and recs[1][1] != victim.pid, (job, recs)
        assert sum(len(r) for r in records.values()) == JOBS + len(repeated)
        assert recovered_after < 30
        print(f"orphaned={orphaned} repeated={len(repeated)} after={recovered_after:.2f}s")

        # -- the queue is empty ----------------------------------------------------------------
        assert await client.xlen(stream) == 0
        assert int((await client.xpending(stream, "aqw"))["pending"]) == 0
        assert await client.zcard(broker.keys.delayed) == 0
        assert await client.xlen(broker.keys.dlq) == 0
    finally:
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await asyncio.wait_for(proc.wait(), 10)
        for log in logs:
            log.close()
        await producer.close()
        await client.aclose()
        for i in range(len(logs)):
            text = (tmp_path / f"worker-{i}.log").read_text(errors="replace")
            if "Traceback" in text:
                print(f"--- worker-{i}.log ---\n{text[-4000:]}")
