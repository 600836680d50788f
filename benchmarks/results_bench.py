"""Results in aqw: what keeping them costs the drain, and how fast ``app.result`` wakes up.

Two measurements, each on the real Redis at 127.0.0.1:6379 db 13 (``--url``), each trial in
fresh interpreters, in queues of their own whose keys are deleted afterwards (never a
``FLUSHDB``):

1. **drain, keep_result off vs on**: ``--jobs`` jobs are enqueued with ``enqueue_many``
   before the clock starts, then one worker (``--concurrency``, burst mode) drains them. The
   handler returns a small dict (``{"n": n, "ok": True}``) in both variants; only
   ``keep_result`` differs. Trials alternate off, on, off, on ... (``--repeat`` each); the
   medians and the ratio on / off are reported, with the worker's CPU time per job.
2. **latency from a job's end to ``app.result()`` returning**, the way users run it: the
   worker in its own process, the producer/waiter in another. The producer offers ``--rate``
   jobs/s for ``--seconds`` s (open loop) and awaits ``app.result(job_id, timeout=10)`` for
   each, concurrently. The handler returns ``time.time()`` as its last statement, so
   ``time.time() - result`` taken when ``app.result`` returns is the ack round trip, the
   wake-up of the waiter and the read of the record (one machine, one clock). The enqueue to
   result time is reported too. Baseline in the same run, trials alternating with aqw's: a
   raw redis-py worker that ``RPUSH``es ``result:<id> <time>`` per job and a waiter that
   ``BLPOP``s ``result:<id>``, which costs a connection per waiting job where aqw's design
   uses one blocked connection per process.

    python benchmarks/results_bench.py [--jobs 20000] [--repeat 3] [--rate 200] [--seconds 10]
                                       [--json results.json]

Bounded: every subprocess has a timeout (killed with its process group past it), and the
script stops by itself; a few minutes with the defaults on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import platform
import resource
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
URL = "redis://127.0.0.1:6379/13"
#: what every key of a trial starts with: aqw's queue keys, and the raw baseline's
RAW_PREFIX = "rbench"
RESULT_TIMEOUT = 10.0
WARMUP_JOBS = 20
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0


# -- children: each runs in a fresh interpreter ------------------------------------------------


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def redis_cpu(client: Any) -> float:
    info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def child_drain(spec: dict[str, Any]) -> dict[str, Any]:
    """Enqueue ``jobs`` jobs, then time one burst worker draining them."""
    import redis.asyncio as aioredis

    import aqw

    url, queue, jobs = spec["url"], spec["queue"], spec["jobs"]
    app = aqw.App(url, queue=queue)

    @app.task(name="work", keep_result=spec["keep_result"])
    async def work(n: int) -> dict[str, Any]:
        return {"n": n, "ok": True}

    ids: list[str] = []
    for start in range(0, jobs, 1000):
        ids += await work.enqueue_many(list(range(start, min(jobs, start + 1000))))
    probe = aioredis.Redis.from_url(url)
    redis_before = await redis_cpu(probe)
    cpu_before = cpu_seconds()
    began = time.perf_counter()
    async with app.worker(concurrency=spec["concurrency"], burst=True) as worker:
        await asyncio.wait_for(worker.wait_stopped(), spec["timeout"])
    elapsed = time.perf_counter() - began
    cpu = cpu_seconds() - cpu_before
    redis_used = await redis_cpu(probe)
    # the last job's record: its result is there with keep_result, not without
    last = await app.result(ids[-1], timeout=5)
    record_key = f"aqw:{{{queue}}}:job:{ids[-1]}"
    record_bytes = await probe.memory_usage(record_key)
    await probe.aclose()
    await app.close()
    return {
        "processed": worker.stats.processed,
        "seconds": elapsed,
        "worker_cpu_s": cpu,
        "redis_cpu_s": redis_used - redis_before,
        "last_result": last,
        "record_bytes": record_bytes,
    }


def stdin_closed() -> asyncio.Event:
    """An event set when the parent closes our stdin (its way to stop a worker)."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    fd = sys.stdin.fileno()

    def readable() -> None:
        if not os.read(fd, 1024):
            loop.remove_reader(fd)
            done.set()

    loop.add_reader(fd, readable)
    return done


async def serve_until_stopped(deadline: float) -> None:
    print("ready", flush=True)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stdin_closed().wait(), deadline)


async def child_aqw_worker(spec: dict[str, Any]) -> dict[str, Any]:
    import aqw

    app = aqw.App(spec["url"], queue=spec["queue"])

    @app.task(name="stamp", keep_result=True)
    async def stamp(n: int) -> float:
        return time.time()

    async with app.worker(concurrency=spec["concurrency"]) as worker:
        await serve_until_stopped(spec["deadline"])
    await app.close()
    return {"processed": worker.stats.processed}


async def child_raw_worker(spec: dict[str, Any]) -> dict[str, Any]:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(spec["url"])
    prefix = f"{RAW_PREFIX}:{spec['queue']}"
    stop = asyncio.Event()
    processed = 0

    async def loop() -> None:
        nonlocal processed
        while not stop.is_set():
            popped = await client.blpop([f"{prefix}:jobs"], timeout=0.5)
            if not popped:
                continue
            job_id = popped[1].decode()
            await client.rpush(f"{prefix}:result:{job_id}", repr(time.time()))
            processed += 1

    runner = asyncio.create_task(loop())
    await serve_until_stopped(spec["deadline"])
    stop.set()
    await asyncio.wait_for(runner, 5)
    await client.aclose()
    return {"processed": processed}


class Offered:
    """Latencies of the jobs an open-loop producer offers, and how far it fell behind."""

    def __init__(self) -> None:
        self.wake: list[float] = []  # job's end -> result returned, seconds
        self.e2e: list[float] = []  # before the enqueue -> result returned
        self.errors: dict[str, int] = {}
        self.inflight = 0
        self.peak_inflight = 0
        self.max_lag = 0.0

    def enter(self) -> None:
        self.inflight += 1
        self.peak_inflight = max(self.peak_inflight, self.inflight)

    def error(self, exc: BaseException) -> None:
        name = type(exc).__name__
        self.errors[name] = self.errors.get(name, 0) + 1

    async def offer(self, rate: float, seconds: float, one: Any) -> None:
        total = max(1, round(rate * seconds))
        started = time.perf_counter()
        tasks = []
        for i in range(total):
            due = started + i / rate
            pause = due - time.perf_counter()
            if pause > 0:
                await asyncio.sleep(pause)
            else:
                self.max_lag = max(self.max_lag, -pause)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.wait_for(asyncio.gather(*tasks), RESULT_TIMEOUT + 30)

    def report(self, extra: dict[str, Any]) -> dict[str, Any]:
        return {
            "wake_s": self.wake,
            "e2e_s": self.e2e,
            "errors": self.errors,
            "peak_inflight": self.peak_inflight,
            "max_lag_s": self.max_lag,
            **extra,
        }


async def child_aqw_producer(spec: dict[str, Any]) -> dict[str, Any]:
    import aqw

    app = aqw.App(spec["url"], queue=spec["queue"])

    @app.task(name="stamp", keep_result=True)
    async def stamp(n: int) -> float:
        return time.time()

    for i in range(WARMUP_JOBS):  # connections, scripts, the worker's first reads
        await app.result(await stamp.enqueue(-1 - i), timeout=RESULT_TIMEOUT)
    got = Offered()

    async def one(n: int) -> None:
        got.enter()
        try:
            before = time.time()
            job_id = await stamp.enqueue(n)
            ended = await app.result(job_id, timeout=RESULT_TIMEOUT)
            now = time.time()
            got.wake.append(now - ended)
            got.e2e.append(now - before)
        except Exception as exc:
            got.error(exc)
        finally:
            got.inflight -= 1

    await got.offer(spec["rate"], spec["seconds"], one)
    await app.close()
    return got.report({"connections": None})


async def child_raw_producer(spec: dict[str, Any]) -> dict[str, Any]:
    import redis.asyncio as aioredis

    name = f"{RAW_PREFIX}-{spec['queue']}"
    # the pool opens one connection per command in flight: one per waiting BLPOP
    client = aioredis.Redis.from_url(spec["url"], client_name=name)
    prefix = f"{RAW_PREFIX}:{spec['queue']}"
    got = Offered()

    async def run(n: int) -> tuple[float, float]:
        job_id = uuid.uuid4().hex
        before = time.time()
        await client.rpush(f"{prefix}:jobs", job_id)
        popped = await client.blpop([f"{prefix}:result:{job_id}"], timeout=RESULT_TIMEOUT)
        now = time.time()
        if not popped:
            raise TimeoutError(job_id)
        return now - float(popped[1]), now - before

    for i in range(WARMUP_JOBS):
        await run(-1 - i)

    async def one(n: int) -> None:
        got.enter()
        try:
            wake, e2e = await run(n)
            got.wake.append(wake)
            got.e2e.append(e2e)
        except Exception as exc:
            got.error(exc)
        finally:
            got.inflight -= 1

    await got.offer(spec["rate"], spec["seconds"], one)
    clients = await client.client_list()
    connections = sum(1 for c in clients if c.get("name") == name)
    await client.aclose()
    return got.report({"connections": connections})


CHILDREN = {
    "drain": child_drain,
    "aqw-worker": child_aqw_worker,
    "aqw-producer": child_aqw_producer,
    "raw-worker": child_raw_worker,
    "raw-producer": child_raw_producer,
}


def run_child(role: str, spec_json: str) -> None:
    result = asyncio.run(CHILDREN[role](json.loads(spec_json)))
    aqw = sys.modules.get("aqw")
    if aqw is not None:  # which tree it measured
        result["aqw_dir"] = os.path.dirname(os.path.abspath(aqw.__file__ or ""))
    print(json.dumps(result), flush=True)


# -- the parent: trials, bounds, clean-up ------------------------------------------------------


def log(msg: str) -> None:
    print(f"[results_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def child_cmd(role: str, spec: dict[str, Any]) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--child", role, json.dumps(spec)]


#: the source tree whose ``aqw`` the children import (``--tree``)
TREE = ROOT


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TREE), env.get("PYTHONPATH")]))
    return env


def source_digest(package_dir: Path) -> str:
    """sha256 over aqw's .py and .lua files (relative path + bytes), first 12 hex digits
    (as ``compare.py`` computes it)."""
    h = hashlib.sha256()
    for path in sorted(package_dir.rglob("*")):
        if path.suffix in (".py", ".lua") and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(package_dir)).encode() + b"\0")
            h.update(path.read_bytes())
    return h.hexdigest()[:12]


def kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def last_json(text: str, what: str) -> dict[str, Any]:
    """The child's result (its last JSON line), checked to come from ``TREE``'s aqw."""
    lines = [line for line in text.strip().splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{what} printed no result")
    found: dict[str, Any] = json.loads(lines[-1])
    expected = str((TREE / "aqw").resolve())
    if found.get("aqw_dir", expected) != expected:
        raise RuntimeError(f"{what} imported aqw from {found['aqw_dir']}, not {expected}")
    return found


def run_bounded(role: str, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one child to its end; kill its process group at ``timeout``."""
    proc = subprocess.Popen(
        child_cmd(role, spec),
        cwd=ROOT,
        env=child_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        kill_group(proc)
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"{role} exited {proc.returncode}: {err.strip()[-2000:]}")
    return last_json(out, role)


class Server:
    """A worker child serving until its stdin is closed (killed when it does not stop)."""

    def __init__(self, role: str, spec: dict[str, Any]) -> None:
        self.role = role
        self.errors = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed by kill())
        self.proc = subprocess.Popen(
            child_cmd(role, spec),
            cwd=ROOT,
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            text=True,
            start_new_session=True,
        )

    def wait_ready(self) -> None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], READY_TIMEOUT)
        line = self.proc.stdout.readline() if ready else ""
        if line.strip() != "ready":
            raise RuntimeError(f"{self.role} did not start: {line!r} {self.stderr()}")

    def stderr(self) -> str:
        self.errors.seek(0)
        return self.errors.read()[-2000:]

    def stop(self) -> dict[str, Any]:
        try:  # closes its stdin first
            out, _ = self.proc.communicate(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
            raise RuntimeError(f"{self.role} did not stop within {STOP_TIMEOUT:g}s") from None
        if self.proc.returncode != 0:
            raise RuntimeError(f"{self.role} exited {self.proc.returncode}: {self.stderr()}")
        return last_json(out, self.role)

    def kill(self) -> None:
        if self.proc.poll() is None:
            kill_group(self.proc)
        self.errors.close()


def delete_keys(url: str, queues: list[str]) -> int:
    """SCAN + DEL every key of these trials (aqw's queue keys and the raw baseline's)."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=10)
    deleted = 0
    try:
        for queue in queues:
            for pattern in (f"aqw:{{{queue}}}:*", f"{RAW_PREFIX}:{queue}:*"):
                batch = list(client.scan_iter(match=pattern, count=1000))
                for i in range(0, len(batch), 500):
                    deleted += int(client.delete(*batch[i : i + 500]))
    finally:
        client.close()
    return deleted


def new_queue(kind: str, queues: list[str]) -> str:
    queue = f"rb-{kind}-{uuid.uuid4().hex[:8]}"
    queues.append(queue)
    return queue


def drain_trial(args: argparse.Namespace, keep: bool, queues: list[str]) -> dict[str, Any]:
    queue = new_queue("drain", queues)
    spec = {
        "url": args.url,
        "queue": queue,
        "jobs": args.jobs,
        "concurrency": args.concurrency,
        "keep_result": keep,
        "timeout": args.trial_timeout,
    }
    try:
        got = run_bounded("drain", spec, args.trial_timeout + 60)
    finally:
        delete_keys(args.url, [queue])
    if got["processed"] != args.jobs:
        raise RuntimeError(f"drain: processed {got['processed']} of {args.jobs} jobs")
    expected = {"n": args.jobs - 1, "ok": True} if keep else None
    if got["last_result"] != expected:
        raise RuntimeError(f"drain: the last job's result is {got['last_result']!r}")
    rate = args.jobs / got["seconds"]
    return {
        "jobs_per_s": rate,
        "seconds": got["seconds"],
        "worker_cpu_us_per_job": 1e6 * got["worker_cpu_s"] / args.jobs,
        "redis_cpu_us_per_job": 1e6 * got["redis_cpu_s"] / args.jobs,
        "record_bytes": got["record_bytes"],
    }


def latency_trial(args: argparse.Namespace, kind: str, queues: list[str]) -> dict[str, Any]:
    queue = new_queue(kind, queues)
    deadline = args.seconds + RESULT_TIMEOUT + 120
    spec = {
        "url": args.url,
        "queue": queue,
        "concurrency": args.concurrency,
        "rate": args.rate,
        "seconds": args.seconds,
        "deadline": deadline,
    }
    server = Server(f"{kind}-worker", spec)
    try:
        server.wait_ready()
        got = run_bounded(f"{kind}-producer", spec, deadline)
        served = server.stop()
    finally:
        server.kill()
        delete_keys(args.url, [queue])
    got["worker_processed"] = served["processed"]
    return got


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between the closest ranks (``q`` in 0..100)."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def ms(value: float | None) -> float | None:
    return None if value is None else round(1e3 * value, 3)


def summarise_latency(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Per trial p50/p99/max in ms; the median of the trials' p50 and p99, the max of all."""
    per = []
    for t in trials:
        per.append(
            {
                "count": len(t["wake_s"]),
                "errors": t["errors"],
                "wake_p50_ms": ms(percentile(t["wake_s"], 50)),
                "wake_p99_ms": ms(percentile(t["wake_s"], 99)),
                "wake_max_ms": ms(max(t["wake_s"], default=None)),
                "e2e_p50_ms": ms(percentile(t["e2e_s"], 50)),
                "e2e_p99_ms": ms(percentile(t["e2e_s"], 99)),
                "e2e_max_ms": ms(max(t["e2e_s"], default=None)),
                "peak_inflight": t["peak_inflight"],
                "producer_max_lag_ms": ms(t["max_lag_s"]),
                "connections": t["connections"],
                "worker_processed": t["worker_processed"],
            }
        )

    def med(field: str) -> float | None:
        vals = [p[field] for p in per if p[field] is not None]
        return round(statistics.median(vals), 3) if vals else None

    def top(field: str) -> float | None:
        vals = [p[field] for p in per if p[field] is not None]
        return max(vals) if vals else None

    errors: dict[str, int] = {}
    for p in per:
        for name, n in p["errors"].items():
            errors[name] = errors.get(name, 0) + n
    return {
        "count": sum(p["count"] for p in per),
        "errors": errors,
        "wake_p50_ms": med("wake_p50_ms"),
        "wake_p99_ms": med("wake_p99_ms"),
        "wake_max_ms": top("wake_max_ms"),
        "e2e_p50_ms": med("e2e_p50_ms"),
        "e2e_p99_ms": med("e2e_p99_ms"),
        "e2e_max_ms": top("e2e_max_ms"),
        "peak_inflight": top("peak_inflight"),
        "connections": top("connections"),
        "trials": per,
    }


def summarise_drain(trials: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {"trials": trials}
    for label, rows in trials.items():
        out[label] = {
            field: round(statistics.median(r[field] for r in rows), 1)
            for field in (
                "jobs_per_s",
                "worker_cpu_us_per_job",
                "redis_cpu_us_per_job",
                "record_bytes",
            )
        }
    off, on = out["off"]["jobs_per_s"], out["on"]["jobs_per_s"]
    out["on_over_off"] = round(on / off, 3)
    pairs = zip(trials["off"], trials["on"], strict=True)
    out["on_over_off_per_round"] = [round(b["jobs_per_s"] / a["jobs_per_s"], 3) for a, b in pairs]
    return out


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}{unit}"
    return f"{value:.2f}{unit}"


def print_report(report: dict[str, Any], out: Any) -> None:
    p = report["params"]
    print(f"aqw results benchmark, {report['generated_at']}, {p['url']}", file=out)
    print(f"aqw from {report['tree']} (sources {report['aqw_source_digest']})", file=out)
    print(
        f"load average before {report['loadavg_before']}, after {report['loadavg_after']}",
        file=out,
    )
    drain = report.get("drain")
    if drain:
        print(
            f"\ndrain: {p['jobs']:,} jobs, concurrency {p['concurrency']}, median of"
            f" {p['repeat']} interleaved trials",
            file=out,
        )
        print(
            f"  {'keep_result':<12} {'jobs/s':>9} {'worker CPU us/job':>18}"
            f" {'Redis CPU us/job':>17} {'record bytes':>13}",
            file=out,
        )
        for label in ("off", "on"):
            d = drain[label]
            rates = ", ".join(f"{t['jobs_per_s']:,.0f}" for t in drain["trials"][label])
            print(
                f"  {label:<12} {d['jobs_per_s']:>9,.0f} {d['worker_cpu_us_per_job']:>18.1f}"
                f" {d['redis_cpu_us_per_job']:>17.1f} {d['record_bytes']:>13,.0f}"
                f"   trials: {rates}",
                file=out,
            )
        print(
            f"  on / off: {drain['on_over_off']:.3f} (per round:"
            f" {', '.join(f'{x:.3f}' for x in drain['on_over_off_per_round'])});"
            " goal >= 0.85",
            file=out,
        )
    latency = report.get("latency")
    if latency:
        print(
            f"\nlatency: {p['rate']:g} jobs/s offered for {p['seconds']:g} s per trial,"
            f" {p['repeat']} interleaved trials each (p50/p99: median of the trials; max: of all)",
            file=out,
        )
        print(
            f"  {'':<26} {'count':>6} {'end->result p50/p99/max ms':>28}"
            f" {'enqueue->result p50/p99 ms':>27} {'peak waiting':>12} {'conns':>5}",
            file=out,
        )
        names = {"aqw": "aqw app.result", "raw": "raw RPUSH/BLPOP baseline"}
        for kind in ("aqw", "raw"):
            s = latency[kind]
            wake = f"{fmt(s['wake_p50_ms'])} / {fmt(s['wake_p99_ms'])} / {fmt(s['wake_max_ms'])}"
            e2e = f"{fmt(s['e2e_p50_ms'])} / {fmt(s['e2e_p99_ms'])}"
            conns = "1" if kind == "aqw" else str(s["connections"])
            print(
                f"  {names[kind]:<26} {s['count']:>6} {wake:>28} {e2e:>27}"
                f" {s['peak_inflight']:>12} {conns:>5}",
                file=out,
            )
            if s["errors"]:
                print(f"    errors: {s['errors']}", file=out)
        print(
            "  conns: blocked connections the waiters used (aqw: one listener per process;"
            " raw: the pool's connections at the end)",
            file=out,
        )


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        run_child(sys.argv[2], sys.argv[3])
        return 0
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain trial")
    parser.add_argument("--repeat", type=int, default=3, help="trials per variant")
    parser.add_argument("--rate", type=float, default=200.0, help="jobs/s offered (latency)")
    parser.add_argument("--seconds", type=float, default=10.0, help="latency trial length")
    parser.add_argument("--concurrency", type=int, default=100, help="worker concurrency")
    parser.add_argument("--only", choices=("drain", "latency"), help="one measurement only")
    parser.add_argument("--url", default=URL, help=f"the Redis (default {URL})")
    parser.add_argument(
        "--tree", type=Path, default=ROOT, help="the source tree to measure (default: this one)"
    )
    parser.add_argument("--trial-timeout", type=float, default=300.0, help="seconds per drain")
    parser.add_argument(
        "--json", metavar="PATH", help="also write the report as JSON ('-': stdout)"
    )
    args = parser.parse_args()
    if args.jobs < 1 or args.repeat < 1 or args.rate <= 0 or args.seconds <= 0:
        parser.error("--jobs, --repeat, --rate and --seconds must be positive")

    global TREE
    TREE = args.tree.resolve()
    if not (TREE / "aqw" / "__init__.py").is_file():
        parser.error(f"--tree {args.tree}: no aqw package there")
    digest_before = source_digest(TREE / "aqw")
    queues: list[str] = []
    report: dict[str, Any] = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": "python benchmarks/results_bench.py " + " ".join(sys.argv[1:]),
        "params": {
            k: getattr(args, k) for k in ("jobs", "repeat", "rate", "seconds", "concurrency", "url")
        },
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "tree": str(TREE),
        "aqw_source_digest": digest_before,
        "loadavg_before": loadavg(),
        "queues": queues,
    }
    started = time.monotonic()
    try:
        if args.only in (None, "drain"):
            drains: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
            for i in range(args.repeat):
                for label in ("off", "on"):
                    row = drain_trial(args, label == "on", queues)
                    drains[label].append(row)
                    log(
                        f"drain {i + 1}/{args.repeat} keep_result {label}: {row['jobs_per_s']:,.0f}"
                    )
            report["drain"] = summarise_drain(drains)
        if args.only in (None, "latency"):
            lat: dict[str, list[dict[str, Any]]] = {"aqw": [], "raw": []}
            for i in range(args.repeat):
                for kind in ("aqw", "raw"):
                    got = latency_trial(args, kind, queues)
                    lat[kind].append(got)
                    p50 = ms(percentile(got["wake_s"], 50))
                    p99 = ms(percentile(got["wake_s"], 99))
                    log(f"latency {i + 1}/{args.repeat} {kind}: end->result {p50} / {p99} ms")
            report["latency"] = {k: summarise_latency(v) for k, v in lat.items()}
    finally:
        left = delete_keys(args.url, queues)
        if left:
            log(f"deleted {left} leftover keys")
    report["loadavg_after"] = loadavg()
    digest_after = source_digest(TREE / "aqw")
    if digest_after != digest_before:
        report["aqw_source_digest_after"] = digest_after
        log(f"WARNING: aqw's sources in {TREE} changed during the run: the trials may differ")
    report["elapsed_s"] = round(time.monotonic() - started, 1)
    if args.json == "-":
        print_report(report, sys.stderr)
        print(json.dumps(report, indent=2))
    else:
        print_report(report, sys.stdout)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
            log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
