"""What a NATS worker waits for after a fault (docs/benchmarks.md, "NATS: the drain after
faults"): one worker process (``tests/brokers/nats/chaos_worker.py``) on a private
nats-server with a file store, a backlog of no-op-ish jobs, then

1. the time from a worker's spawn to its start line and to its first job done;
2. the server SIGKILLed and restarted under it: from the server being back to the next job;
3. the worker SIGKILLed while it holds jobs and a new one spawned: from the spawn (and from
   the kill) to the new worker's first job (the killed one's jobs wait out the AckWait).

    python benchmarks/nats_fault_gaps.py [ROUNDS]

Each job writes a row in PostgreSQL (127.0.0.1:5432, database test) under ``ctx.effect``,
as in the chaos test. Times are read from the worker's log (``AQW_CHAOS_LOG``)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg

import aqw
from aqw.idempotency import SqlCompletionStore
from aqw.job import Job

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.brokers.nats.conftest import Server  # noqa: E402

DSN = "postgresql://postgres@127.0.0.1:5432/test"
DONE = re.compile(rb"^(\d+\.\d+) (\d+) job \S+ \(apply\) attempt \d+ succeeded")
STARTED = re.compile(rb"^(\d+\.\d+) (\d+) worker \S+ started")


def _times(log: Path, pattern: re.Pattern[bytes], pid: int | None = None) -> list[float]:
    out = []
    for line in log.read_bytes().splitlines():
        m = pattern.match(line)
        if m and (pid is None or int(m.group(2)) == pid):
            out.append(float(m.group(1)))
    return out


async def _round(store_dir: Path, log: Path) -> dict[str, float]:
    server = Server(store_dir)
    server.start()
    queue, table = f"gaps-{uuid.uuid4().hex[:8]}", f"nats_gaps_{uuid.uuid4().hex[:8]}"
    db = await asyncpg.connect(DSN)
    await SqlCompletionStore().ensure_schema(db)
    await db.execute(f"CREATE TABLE {table} (job_id text, n int, fence bigint)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AQW_CHAOS_LOG": "1"}
    procs: list[asyncio.subprocess.Process] = []

    async def spawn() -> tuple[asyncio.subprocess.Process, float]:
        with log.open("ab") as out:
            at = time.time()
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                str(ROOT / "tests/brokers/nats/chaos_worker.py"),
                server.url,
                queue,
                table,
                stdout=out,
                stderr=out,
                env=env,
            )
        procs.append(proc)
        return proc, at

    async def applied() -> int:
        return int(await db.fetchval(f"SELECT count(*) FROM {table}"))

    async def until(n: int, within: float = 60) -> None:
        deadline = time.monotonic() + within
        while await applied() < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{await applied()} applied, waiting for {n}")
            await asyncio.sleep(0.05)

    try:
        producer = aqw.App(f"{server.url}?queue={queue}&ack_wait=3")
        for start in range(0, 6000, 100):
            await producer.broker.publish(
                [Job(task="apply", payload=n) for n in range(start, start + 100)]
            )
        await producer.broker.close()
        first, spawned = await spawn()
        await until(300)
        started = _times(log, STARTED, first.pid)[0]
        done = _times(log, DONE, first.pid)
        out = {"spawn->started": started - spawned, "spawn->first job": done[0] - spawned}
        server.kill()
        await asyncio.sleep(0.5)
        server.start()
        back = time.time()
        n = await applied()
        await until(n + 300)
        after = [t for t in _times(log, DONE, first.pid) if t > back]
        out["server back->next job"] = after[0] - back
        first.send_signal(signal.SIGKILL)
        await first.wait()
        killed_at = time.time()
        n = await applied()
        second, spawned = await spawn()
        await until(n + 300)
        done = _times(log, DONE, second.pid)
        out["respawn->first job"] = done[0] - spawned
        out["kill->first job again"] = done[0] - killed_at
        return out
    finally:
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGKILL)
                await p.wait()
        server.kill()
        await db.execute(f"DROP TABLE {table}")
        await db.execute("DELETE FROM aqw_completions WHERE queue = $1", queue)
        await db.execute("DELETE FROM aqw_fences WHERE queue = $1", queue)
        await db.close()


async def main(rounds: int) -> None:
    results: dict[str, list[float]] = {}
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            got = await _round(Path(tmp) / "js", Path(tmp) / "worker.log")
        for k, v in got.items():
            results.setdefault(k, []).append(v)
    print(f"load average {os.getloadavg()[0]:.1f}; median of {rounds} (min-max), seconds:")
    for k, v in results.items():
        print(f"  {k:24} {statistics.median(v):6.2f}  ({min(v):.2f}-{max(v):.2f})")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3))
