"""A no-op job's cost, counted, against the budget in benchmarks/budget.toml.

Starts a private redis-server on a free port (no persistence; stopped at the end), then in
one interpreter counts, per job:

* Redis commands for a single awaited enqueue, for ``enqueue_many`` and for the drain (one
  burst worker, concurrency 100), exactly from ``INFO commandstats``: the commands a script
  runs are counted as well as the script call itself;
* the worker's Python function calls per drained job (``cProfile``'s call counts: Python
  and C functions, on the event loop's thread), deterministic whatever else runs on the
  machine; once as an embedded worker (logging not configured: no line written) and once
  with logging set up as ``aqw worker`` sets it up (``drain_logged``: a line per job),
  and, with ``--telemetry``, traced with every job sampled out (``drain_unsampled``) and
  in (``drain_sampled``);
* informational only, never budgeted (they move with load): Redis CPU and worker CPU per job.

Each figure is per job: the difference between a run of ``--jobs`` and one of a tenth of
it, divided by the difference in jobs, so a worker's start and stop do not count. A figure
more than ``margin`` (in the budget file) above its budget fails the check (exit 1); every
figure is printed, with the commands by name. Runs in a few seconds.

    python benchmarks/cost_budget.py [--jobs 1000] [--telemetry] [--budget FILE] [--json]
    python benchmarks/cost_budget.py --against /tmp/aqw-before   # two trees side by side
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import logging
import os
import pstats
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    """A redis-server of this script's own, on a free port, gone when the script ends."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="aqw-cost-")
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemExit("cost_budget: redis-server is not installed")
        self.proc = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise SystemExit("cost_budget: the private redis-server did not start")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Counters:
    """INFO commandstats and Redis CPU, read before and after a step."""

    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url)

    def read(self) -> tuple[dict[str, int], float]:
        stats = self.client.info("commandstats")
        calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
        cpu = self.client.info("cpu")
        return calls, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])

    def reset(self) -> None:
        self.client.config_resetstat()


# The commands of the measuring itself, never the job's.
OWN = {"info", "config|resetstat", "config"}


class Step:
    """What one step cost Redis and this process: commands by name, calls, CPU."""

    def __init__(self, commands: dict[str, int], calls: int, redis_cpu: float, cpu: float):
        self.commands, self.calls, self.redis_cpu, self.cpu = commands, calls, redis_cpu, cpu

    def per_job(self, small: Step, jobs: int) -> dict[str, Any]:
        names = sorted(set(self.commands) | set(small.commands))
        by_name = {n: (self.commands.get(n, 0) - small.commands.get(n, 0)) / jobs for n in names}
        return {
            "commands": sum(by_name.values()),
            "by_command": {n: round(v, 3) for n, v in by_name.items() if abs(v) >= 0.001},
            "calls": (self.calls - small.calls) / jobs,
            "redis_cpu_us": (self.redis_cpu - small.redis_cpu) / jobs * 1e6,
            "cpu_us": (self.cpu - small.cpu) / jobs * 1e6,
        }


def cpu_now() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def measure(counters: Counters, body: Callable[[], Awaitable[None]], profile: bool) -> Step:
    counters.reset()
    before, redis_before = counters.read()
    prof = cProfile.Profile() if profile else None
    began = cpu_now()
    if prof is not None:
        prof.enable()
    try:
        await body()
    finally:
        if prof is not None:
            prof.disable()
    cpu = cpu_now() - began
    after, redis_after = counters.read()
    commands = {
        n: after.get(n, 0) - before.get(n, 0)
        for n in after
        if n not in OWN and after.get(n, 0) != before.get(n, 0)
    }
    calls = 0
    if prof is not None:
        calls = sum(v[1] for v in pstats.Stats(prof).stats.values())  # type: ignore[attr-defined]
    return Step(commands, calls, redis_after - redis_before, cpu)


@contextlib.contextmanager
def cli_logging() -> Iterator[None]:
    """Logging as ``aqw worker`` configures it (INFO, text lines), written to /dev/null;
    the root logger put back afterwards."""
    from aqw.cli import _logs

    configure_logging = _logs.configure_logging
    flush_logging = getattr(_logs, "flush_logging", lambda: None)

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    with open(os.devnull, "w") as sink:
        try:
            configure_logging("info", "text", stream=sink, force=True, background=True)
        except TypeError:  # a tree from before background logging
            configure_logging("info", "text", stream=sink, force=True)
        try:
            yield
        finally:
            flush_logging()
            for handler in list(root.handlers):
                if handler not in handlers:
                    root.removeHandler(handler)
                    handler.close()
            root.setLevel(level)


def traced_app(queue: str, url: str, sampled: bool) -> Any:
    """An app on ``queue`` whose tracer provider samples every job in (``sampled``) or out,
    with the no-op task; None without the OpenTelemetry SDK."""
    import aqw

    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
    except ImportError:
        return None
    provider = TracerProvider(sampler=ALWAYS_ON if sampled else ALWAYS_OFF)
    app = aqw.App(url, queue=queue, tracer_provider=provider)

    @app.task(name="noop")
    async def noop(n: int) -> None:
        return None

    return app


async def steps(url: str, jobs: int, concurrency: int, telemetry: bool = False) -> dict[str, Step]:
    """Enqueue (single, then many) and drain `jobs` no-op jobs in a queue of their own."""
    import aqw

    counters = Counters(url)
    app = aqw.App(url, queue="cost-" + uuid.uuid4().hex[:8])

    @app.task(name="noop")
    async def noop(n: int) -> None:
        return None

    out: dict[str, Step] = {}

    async def single() -> None:
        for n in range(jobs):
            await noop.enqueue(n)

    async def many() -> None:
        for start in range(0, jobs, 1000):
            await noop.enqueue_many(list(range(start, min(jobs, start + 1000))))

    async def drain(by: aqw.App = app) -> None:
        async with by.worker(concurrency=concurrency, burst=True) as worker:
            await asyncio.wait_for(worker.wait_stopped(), 120)
        if worker.stats.processed != 2 * jobs:
            raise SystemExit(f"cost_budget: drained {worker.stats.processed} of {2 * jobs}")

    # warm the connection and the scripts first: a first call loads them
    await noop.enqueue(-1)
    await noop.enqueue_many([-2])
    async with app.worker(concurrency=concurrency, burst=True) as warm:
        await asyncio.wait_for(warm.wait_stopped(), 60)

    out["enqueue"] = await measure(counters, single, profile=False)
    out["enqueue_many"] = await measure(counters, many, profile=False)
    out["drain"] = await measure(counters, drain, profile=True)
    # the same drain with logging set up as ``aqw worker`` sets it up: a line per job
    await single()
    await many()
    with cli_logging():
        out["drain_logged"] = await measure(counters, drain, profile=True)
    # and traced: every job sampled out, then every job sampled (spans made, none exported:
    # the SDK's own floor); each by a worker of an app with that tracer provider
    for name, sampled in (("drain_unsampled", False), ("drain_sampled", True)):
        traced = traced_app(app.queue, url, sampled) if telemetry else None
        if traced is None:
            break
        await single()
        await many()
        out[name] = await measure(counters, partial(drain, traced), profile=True)
        await traced.close()
    await app.close()
    counters.client.close()
    return out


def run(url: str, jobs: int, concurrency: int, telemetry: bool) -> dict[str, dict[str, Any]]:
    small_jobs = max(1, jobs // 10)
    small = asyncio.run(steps(url, small_jobs, concurrency, telemetry))
    big = asyncio.run(steps(url, jobs, concurrency, telemetry))
    figures: dict[str, dict[str, Any]] = {}
    for name in ("enqueue", "enqueue_many"):
        figures[name] = big[name].per_job(small[name], jobs - small_jobs)
    # each drain runs both enqueues' jobs
    for name in ("drain", "drain_logged", "drain_unsampled", "drain_sampled"):
        if name in big:
            figures[name] = big[name].per_job(small[name], 2 * (jobs - small_jobs))
    return figures


def check(figures: dict[str, dict[str, Any]], budget: dict[str, Any]) -> list[str]:
    margin = float(budget.get("margin", 0.05))
    over = []
    for step, limits in budget.items():
        if not isinstance(limits, dict):
            continue
        for key, allowed in limits.items():
            got = float(figures[step][key])
            if got > float(allowed) * (1 + margin):
                over.append(
                    f"{step}.{key}: {got:.2f} per job, budget {allowed} (+{margin:.0%} margin)"
                )
    return over


def show(figures: dict[str, dict[str, Any]], budget: dict[str, Any]) -> None:
    for step, f in figures.items():
        limits = budget.get(step, {})
        line = f"{step:>13}: {f['commands']:6.2f} Redis commands/job"
        if "commands" in limits:
            line += f" (budget {limits['commands']})"
        if step.startswith("drain"):
            line += f", {f['calls']:7.1f} Python calls/job"
            if "calls" in limits:
                line += f" (budget {limits['calls']})"
        line += f"; Redis CPU {f['redis_cpu_us']:.1f} us/job, this process {f['cpu_us']:.1f} us/job"
        print(line)
        print(" " * 15 + ", ".join(f"{n} {v:g}" for n, v in f["by_command"].items()))
    print("               (CPU figures move with load and are not budgeted; the drain's CPU")
    print("               is under the profiler)")


def figures_of(
    tree: Path, jobs: int, concurrency: int, telemetry: bool
) -> dict[str, dict[str, Any]]:
    """The figures of another source tree, counted by this script in a fresh interpreter
    with ``PYTHONPATH`` set to the tree (``python -P``: the current directory is not put
    first on ``sys.path``)."""
    env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
    out = subprocess.run(
        [sys.executable, "-P", __file__, "--jobs", str(jobs), "--concurrency", str(concurrency),
         "--budget", os.devnull, "--json-only", "--tree", str(tree.resolve()),
         *(["--telemetry"] if telemetry else [])],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"cost_budget: the run of {tree} failed:\n{out.stderr[-2000:]}")
    figures: dict[str, dict[str, Any]] = json.loads(out.stdout)
    return figures


def side_by_side(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]], a: str, b: str
) -> None:
    """A markdown table of two trees' figures."""
    print(f"| per job | {a} | {b} |")
    print("| --- | ---: | ---: |")
    rows = [
        ("enqueue", "commands", "Redis commands, single awaited enqueue", "{:.2f}"),
        ("enqueue_many", "commands", "Redis commands, `enqueue_many`", "{:.2f}"),
        ("drain", "commands", "Redis commands, drain", "{:.2f}"),
        ("drain", "calls", "Python calls on the loop, drain (logging not set up)", "{:.1f}"),
        ("drain_logged", "calls", "Python calls on the loop, drain, aqw worker logging", "{:.1f}"),
        ("drain_unsampled", "calls", "Python calls on the loop, traced, sampled out", "{:.1f}"),
        ("drain_sampled", "calls", "Python calls on the loop, traced, sampled", "{:.1f}"),
        ("drain", "redis_cpu_us", "Redis CPU us, drain (moves with load)", "{:.1f}"),
    ]  # fmt: skip
    for step, key, label, form in rows:
        cells = [form.format(f[step][key]) if step in f else "-" for f in (before, after)]
        print(f"| {label} | {cells[0]} | {cells[1]} |")
    for name, f in (("before", before), ("after", after)):
        by = ", ".join(f"{n} {v:g}" for n, v in f["drain"]["by_command"].items())
        print(f"\n{name}, drain commands per job: {by}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument(
        "--telemetry", action="store_true", help="also drain traced, sampled out and in"
    )
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--budget", type=Path, default=HERE / "budget.toml")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    parser.add_argument(
        "--against",
        type=Path,
        help="another source tree (e.g. the commit before a change): both trees' figures "
        "side by side, as a markdown table; no budget check",
    )
    parser.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    # a stop (a CI timeout) runs the finally blocks: the private redis-server goes too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    budget = {}
    if args.budget.is_file() and args.budget.stat().st_size:
        budget = tomllib.loads(args.budget.read_text())
    import aqw

    if args.tree is not None and not aqw.__file__.startswith(str(args.tree)):
        raise SystemExit(f"cost_budget: imported {aqw.__file__}, not the tree {args.tree}")
    if args.against is not None:
        here = Path(aqw.__file__).resolve().parent.parent
        before = figures_of(args.against, args.jobs, args.concurrency, args.telemetry)
        after = figures_of(here, args.jobs, args.concurrency, args.telemetry)
        side_by_side(before, after, str(args.against), str(here))
        return 0
    if not args.json_only:
        print(f"cost_budget: aqw from {os.path.dirname(aqw.__file__)}, {args.jobs} jobs per step")
    server = PrivateRedis()
    try:
        figures = run(server.url, args.jobs, args.concurrency, args.telemetry)
    finally:
        server.stop()
    if args.json_only:
        print(json.dumps(figures))
        return 0
    show(figures, budget)
    if args.json:
        print(json.dumps(figures, indent=2))
    over = check(figures, budget)
    for line in over:
        print(f"cost_budget: OVER BUDGET {line}")
    if not over and budget:
        print(f"cost_budget: within budget ({args.budget.name})")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
