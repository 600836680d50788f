"""Drain rate with 1, 2, ... worker processes, the way users run them, and peers measured alike.

Each trial fills a queue from a producer process of its own (20,000 no-op jobs by default,
``enqueue_many`` in batches of 1,000, before the clock starts), then runs
``aqw worker scaling_bench:app --burst --concurrency C`` (with ``--processes N`` for more than
one process, the supervisor of the CLI) until every process has exited. The figure is the jobs
over the time from the first job's start, in any process, to the last job's end: what the
processes did together, without interpreter start-up. The wall rate (from spawning the command
to its exit: start-up, imports, connecting, the end of the burst) is reported next to it.
``--loops asyncio,uvloop`` adds ``--loop uvloop`` variants (extra ``aqw[uvloop]``).

With ``--peers aqw,raw-streams,taskiq-redis`` the peers of ``benchmarks/peers/`` join the same
rounds, also with the producer in a process of its own: the producer process enqueues with the
peer's adapter (32 lanes of single awaited enqueues, as ``_bench.py`` preloads), then a worker
process starts the adapter's worker and is timed from that call until its handler has counted
every job (as ``_bench.py`` times a drain). Each peer runs under its own venv's python (made by
``setup_peers.sh``; ``run_peers.PEERS`` says which).

Where the time goes, per variant: the workers' CPU per job (each process's ``process_time``
over its own jobs), Redis's CPU per job and its share of a core (``INFO cpu``, sampled every
25 ms by the runner, read over the drain's window), and how busy the machine's cores were over
the same window (``/proc/stat``), less the workers and Redis: the cores other processes took
("other cores"; the machine is shared). The CPU ceiling is the machine's cores over the workers'
and Redis's CPU per job: what any number of processes could reach if nothing else ran and
nothing waited. Before each trial the runner waits (``--quiet-wait``, 10 s at most) for a second
in which at most ``--quiet-cores`` cores were busy, and a trial during which other processes
took more than ``--noisy-cores`` is tried again (``--retries`` times at most; the quietest
attempt counts, marked noisy when none was quiet; every attempt is kept in the JSON).

Redis: by default a private ``redis-server`` on a free loopback port, started and stopped by
this script (``--redis-url redis://127.0.0.1:6379/13`` uses another; its database is flushed
before every trial, and db 0 is refused). Rounds are interleaved: every variant once per round,
each round starting one variant further along; every figure is the median over ``--trials``
rounds, with the lowest and highest next to it. Every process has a timeout and the whole run
stops starting trials after ``--timeout`` s. The table goes to stdout, everything to
``--out`` (default ``benchmarks/results/scaling.json``)::

    python benchmarks/scaling_bench.py                               # 1..cpu_count processes
    python benchmarks/scaling_bench.py --loops asyncio,uvloop --trials 3 \\
        --peers aqw,raw-streams,taskiq-redis --python .venv-peers/peers/aqw/bin/python

``--python`` is the interpreter that runs ``aqw worker`` and the producer: the aqw under test
is the one it imports (from a directory of its own, never this checkout by accident: the
processes run in a temporary directory, and the import is checked against ``--python``'s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
PEERS_DIR = HERE / "peers"
DEFAULT_OUT = HERE / "results" / "scaling.json"

#: Environment of a worker or producer process: the Redis URL, the queue, where to report.
ENV_URL = "AQW_SCALING_URL"
ENV_QUEUE = "AQW_SCALING_QUEUE"
ENV_REPORTS = "AQW_SCALING_REPORTS"

ENQUEUE_BATCH = 1_000
PEER_LANES = 32
#: Jobs between two readings of a worker process's CPU clock (a reading is a system call).
CPU_EVERY = 64
SAMPLE_S = 0.025
PROCESS_TIMEOUT = 300.0


# -- the app that `aqw worker scaling_bench:app` runs ----------------------------------------


class DrainMarks:
    """When this process's first job started and its last ended, and its CPU time over them,
    written as JSON into ``$AQW_SCALING_REPORTS/<pid>.json`` when the process exits."""

    def __init__(self) -> None:
        self.count = 0
        self.first = 0.0
        self.last = 0.0
        self.cpu_first = 0.0
        self.cpu_count = 0  # jobs done when the CPU clock was last read
        self.cpu_last = 0.0

    def job(self) -> None:
        now = time.time()
        if self.count == 0:
            self.first = now
            self.cpu_first = self.cpu_last = time.process_time()
        self.last = now
        self.count += 1
        if self.count % CPU_EVERY == 0:
            self.cpu_count, self.cpu_last = self.count, time.process_time()

    def write(self, directory: str, aqw_file: str) -> None:
        cpu_jobs = self.cpu_count - 1
        report = {
            "pid": os.getpid(),
            "jobs": self.count,
            "first": self.first,
            "last": self.last,
            "cpu_us_per_job": (self.cpu_last - self.cpu_first) / cpu_jobs * 1e6
            if cpu_jobs > 0
            else None,
            "aqw": aqw_file,
        }
        (Path(directory) / f"{os.getpid()}.json").write_text(json.dumps(report))


_built: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    """``scaling_bench:app``: the App of the worker and producer processes, built on first use
    from ``$AQW_SCALING_URL`` and ``$AQW_SCALING_QUEUE`` (so importing this file as the runner
    needs no aqw)."""
    if name not in ("app", "noop"):
        raise AttributeError(name)
    if not _built:
        import atexit

        import aqw

        marks = DrainMarks()
        app = aqw.App(os.environ[ENV_URL], queue=os.environ[ENV_QUEUE])

        @app.task(name="noop")
        async def noop(n: int) -> None:
            marks.job()

        reports = os.environ.get(ENV_REPORTS)
        if reports:
            atexit.register(marks.write, reports, str(aqw.__file__))
        _built.update(app=app, noop=noop)
    return _built[name]


async def produce(jobs: int) -> dict[str, Any]:
    """The producer process of an aqw trial: ``jobs`` no-op jobs with ``enqueue_many``."""
    app, noop = __getattr__("app"), __getattr__("noop")
    began = time.perf_counter()
    for start in range(0, jobs, ENQUEUE_BATCH):
        await noop.enqueue_many(list(range(start, min(jobs, start + ENQUEUE_BATCH))))
    elapsed = time.perf_counter() - began
    await app.close()
    return {"enqueued": jobs, "enqueue_per_s": jobs / elapsed}


# -- the peers' producer and worker processes ------------------------------------------------


def peer_config(url: str, jobs: int, concurrency: int) -> Any:
    """A ``_bench.Config`` whose ``url`` is ``url`` (the harness's own is 127.0.0.1:6379)."""
    from _bench import Config

    @dataclass(frozen=True)
    class ServerConfig(Config):
        server: str = ""

        @property
        def url(self) -> str:
            return self.server

    return ServerConfig(
        jobs=jobs,
        enqueue_jobs=0,
        rate=1.0,
        duration=1.0,
        concurrency=concurrency,
        db=int(url.rsplit("/", 1)[1]),
        phase_timeout=PROCESS_TIMEOUT,
        total_timeout=PROCESS_TIMEOUT,
        server=url,
    )


async def peer_session(peer: str, cfg: Any, rec: Any, *, producer: bool) -> Any:
    """The peer's ``Session``. Its producer process creates what the worker reads (raw-streams:
    the consumer group, at id 0), so the worker process builds the raw session directly."""
    if peer == "aqw":
        import peer_aqw

        return await peer_aqw.open_session(cfg, rec)
    if peer == "taskiq-redis":
        import peer_taskiq

        return await peer_taskiq.open_session(cfg, rec)
    if peer == "raw-streams":
        import raw_streams
        import redis.asyncio as aioredis

        if producer:
            return await raw_streams.open_session(cfg, rec)
        return raw_streams.RawStreamsSession(cfg, rec, aioredis.from_url(cfg.url))
    raise SystemExit(f"unknown peer {peer!r}")


async def peer_produce(peer: str, url: str, jobs: int) -> dict[str, Any]:
    from _bench import Recorder

    cfg = peer_config(url, jobs, 1)
    session = await peer_session(peer, cfg, Recorder(), producer=True)
    todo = iter(range(jobs))

    async def lane() -> None:
        for _ in todo:
            await session.enqueue(time.time())

    began = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(PEER_LANES)))
    elapsed = time.perf_counter() - began
    await session.close()
    return {"enqueued": jobs, "enqueue_per_s": jobs / elapsed}


async def peer_drain(peer: str, url: str, jobs: int, concurrency: int) -> dict[str, Any]:
    from _bench import Recorder

    cfg = peer_config(url, jobs, concurrency)
    rec = Recorder()
    session = await peer_session(peer, cfg, rec, producer=False)
    rec.reset(jobs)
    cpu0 = time.process_time()
    first = time.time()
    t0 = time.perf_counter()
    await session.start_worker()
    await rec.wait(PROCESS_TIMEOUT, "drain")
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    last = first + elapsed
    await session.stop_worker()
    await session.close()
    return {
        "jobs": rec.done,
        "first": first,
        "last": last,
        "cpu_us_per_job": cpu / jobs * 1e6,
    }


# -- the runner ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """``aqw worker`` with ``processes`` processes on ``loop``, or one peer (``peer``)."""

    processes: int = 1
    loop: str = "asyncio"
    peer: str | None = None

    @property
    def name(self) -> str:
        if self.peer is not None:
            return f"peer {self.peer}"
        return f"aqw worker x{self.processes} {self.loop}"


@dataclass
class Trial:
    variant: str
    round: int
    jobs_per_s: float | None = None
    wall_jobs_per_s: float | None = None
    jobs: int = 0
    window_s: float | None = None
    worker_cpu_us_per_job: float | None = None
    redis_cpu_us_per_job: float | None = None
    redis_core_share: float | None = None
    machine_busy: float | None = None  # of all cores, 0..1, over the drain's window
    #: cores busy with anything but the workers and Redis over the window (other processes)
    other_cores: float | None = None
    busy_before: float | None = None  # cores busy in the second before the trial
    attempt: int = 1
    noisy: bool = False  # other processes took more than --noisy-cores during the window
    #: what the CPU the workers and Redis spent per job allows on all cores: cores / (worker
    #: CPU + Redis CPU per job), the ceiling of any number of processes on this machine
    cpu_ceiling_jobs_per_s: float | None = None
    enqueue_per_s: float | None = None
    processes_seen: int = 0
    per_process_jobs: list[int] = field(default_factory=list)
    error: str | None = None


class Sampler:
    """A thread reading Redis's CPU time (``INFO cpu``) and the machine's busy and total
    jiffies (``/proc/stat``) every ``SAMPLE_S`` seconds, to read back over any window."""

    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=5)
        self.rows: list[tuple[float, float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def jiffies() -> tuple[float, float]:
        """(busy, total) jiffies of all the machine's cores since boot."""
        fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields) - idle, sum(fields)

    def _read(self) -> None:
        info: Any = self.client.info("cpu")
        busy, total = self.jiffies()
        redis_cpu = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
        self.rows.append((time.time(), redis_cpu, busy, total))

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self._read()
            self._stop.wait(SAMPLE_S)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        with contextlib.suppress(Exception):
            self._read()
        self.client.close()

    def at(self, t: float) -> tuple[float, float, float]:
        """(Redis CPU s, busy jiffies, total jiffies) at ``t``, interpolated."""
        rows = self.rows
        before = max((r for r in rows if r[0] <= t), default=rows[0], key=lambda r: r[0])
        after = min((r for r in rows if r[0] >= t), default=rows[-1], key=lambda r: r[0])
        if after[0] == before[0]:
            return before[1], before[2], before[3]
        w = (t - before[0]) / (after[0] - before[0])
        return tuple(b + w * (a - b) for a, b in zip(after[1:], before[1:], strict=True))  # type: ignore[return-value]


class PrivateRedis:
    """A ``redis-server`` of this run on a free loopback port, without persistence."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [
                shutil.which("redis-server") or "redis-server",
                *("--port", str(self.port), "--bind", "127.0.0.1", "--save", ""),
                *("--appendonly", "no", "--protected-mode", "yes", "--loglevel", "warning"),
            ],
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.url = f"redis://127.0.0.1:{self.port}/13"
        import redis

        client = redis.Redis(port=self.port, socket_timeout=1)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise SystemExit(
                        "scaling_bench: the private redis-server did not start"
                    ) from None
                time.sleep(0.05)
        self.version = str(client.info("server")["redis_version"])
        client.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def busy_cores(seconds: float) -> float:
    """Cores the machine kept busy over the next ``seconds`` (``/proc/stat``)."""
    b0, t0 = Sampler.jiffies()
    time.sleep(seconds)
    b1, t1 = Sampler.jiffies()
    return (b1 - b0) / max(t1 - t0, 1.0) * (os.cpu_count() or 1)


def wait_quiet(limit: float, most: float) -> float:
    """Wait, at most ``limit`` s, for a second in which the machine keeps at most ``most``
    cores busy (other processes: the machine is shared); the last second's reading."""
    deadline = time.monotonic() + limit
    while True:
        busy = busy_cores(1.0)
        if busy <= most or time.monotonic() >= deadline:
            return busy


def flush(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=10)
    try:
        client.flushdb()
    finally:
        client.close()


def run_child(cmd: list[str], env: dict[str, str], cwd: str, timeout: float) -> str:
    """Run ``cmd`` in its own process group; its stdout, or RuntimeError (killed at the
    timeout, or a non-zero exit, with the last lines of its stderr)."""
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RuntimeError(f"killed after {timeout:.0f}s: {' '.join(cmd[-6:])}") from None
    if proc.returncode != 0:
        tail = " | ".join(err.strip().splitlines()[-3:])
        raise RuntimeError(f"exit {proc.returncode}: {tail}")
    return out


class Runner:
    def __init__(self, args: argparse.Namespace, url: str, workdir: str) -> None:
        self.args = args
        self.url = url
        self.workdir = workdir
        self.python = str(args.python)
        self.env = {**os.environ, "PYTHONPATH": str(HERE), ENV_URL: url}
        self.env.pop("PYTHONSTARTUP", None)

    def me(self, python: str, role: str, *extra: str) -> list[str]:
        return [python, "-P", str(Path(__file__).resolve()), role, *extra]

    def trial(self, variant: Variant, rnd: int) -> Trial:
        flush(self.url)
        before = wait_quiet(self.args.quiet_wait, self.args.quiet_cores)
        try:
            if variant.peer is not None:
                trial = self._peer_trial(variant, rnd)
            else:
                trial = self._aqw_trial(variant, rnd)
        except (RuntimeError, ValueError, KeyError, json.JSONDecodeError) as exc:
            trial = Trial(variant.name, rnd, error=str(exc))
        finally:
            flush(self.url)
        trial.busy_before = before
        return trial

    def _aqw_trial(self, variant: Variant, rnd: int) -> Trial:
        jobs = self.args.jobs
        queue = "scaling-" + uuid.uuid4().hex[:8]
        reports = Path(tempfile.mkdtemp(prefix="reports-", dir=self.workdir))
        env = {**self.env, ENV_QUEUE: queue, ENV_REPORTS: str(reports)}
        produced = json.loads(
            run_child(
                self.me(self.python, "_produce", "--jobs", str(jobs)),
                env,
                self.workdir,
                PROCESS_TIMEOUT,
            ).splitlines()[-1]
        )
        cmd = [self.python, "-m", "aqw", "--log-level", "warning", "worker", "scaling_bench:app"]
        cmd += ["--burst", "--concurrency", str(self.args.concurrency), "--loop", variant.loop]
        if variant.processes > 1:
            cmd += ["--processes", str(variant.processes)]
        with Sampler(self.url) as sampler:
            spawned = time.time()
            run_child(cmd, env, self.workdir, PROCESS_TIMEOUT)
            exited = time.time()
        rows = [json.loads(p.read_text()) for p in sorted(reports.glob("*.json"))]
        shutil.rmtree(reports, ignore_errors=True)
        trial = self._summarise(variant, rnd, rows, sampler, jobs)
        trial.enqueue_per_s = produced["enqueue_per_s"]
        if trial.jobs:
            trial.wall_jobs_per_s = trial.jobs / (exited - spawned)
        for row in rows:
            if not str(row["aqw"]).startswith(self.args.aqw_dir):
                trial.error = f"a worker imported {row['aqw']}, not {self.args.aqw_dir}"
        return trial

    def _peer_trial(self, variant: Variant, rnd: int) -> Trial:
        assert variant.peer is not None
        jobs, python = self.args.jobs, str(self.args.peer_python[variant.peer])
        common = ["--peer", variant.peer, "--url", self.url, "--jobs", str(jobs)]
        produced = json.loads(
            run_child(
                self.me(python, "_peer_produce", *common), self.env, self.workdir, PROCESS_TIMEOUT
            ).splitlines()[-1]
        )
        drain = self.me(python, "_peer_drain", *common, "--concurrency", str(self.args.concurrency))
        with Sampler(self.url) as sampler:
            spawned = time.time()
            out = run_child(drain, self.env, self.workdir, PROCESS_TIMEOUT)
            exited = time.time()
        row = json.loads(out.splitlines()[-1])
        trial = self._summarise(variant, rnd, [row], sampler, jobs)
        trial.enqueue_per_s = produced["enqueue_per_s"]
        trial.wall_jobs_per_s = jobs / (exited - spawned)
        return trial

    def _summarise(
        self, variant: Variant, rnd: int, rows: list[dict[str, Any]], sampler: Sampler, jobs: int
    ) -> Trial:
        trial = Trial(variant.name, rnd, processes_seen=len(rows))
        rows = [r for r in rows if r["jobs"]]
        trial.per_process_jobs = [int(r["jobs"]) for r in rows]
        trial.jobs = sum(trial.per_process_jobs)
        if trial.jobs < jobs:
            trial.error = f"{trial.jobs} of {jobs} jobs run"
        if not rows:
            return trial
        first, last = min(r["first"] for r in rows), max(r["last"] for r in rows)
        trial.window_s = last - first
        if trial.window_s <= 0:
            return trial
        trial.jobs_per_s = trial.jobs / trial.window_s
        cpus = [r["cpu_us_per_job"] * r["jobs"] for r in rows if r["cpu_us_per_job"] is not None]
        if len(cpus) == len(rows):
            trial.worker_cpu_us_per_job = sum(cpus) / trial.jobs
        r0, b0, t0 = sampler.at(first)
        r1, b1, t1 = sampler.at(last)
        trial.redis_cpu_us_per_job = (r1 - r0) / trial.jobs * 1e6
        trial.redis_core_share = (r1 - r0) / trial.window_s
        if t1 > t0:
            trial.machine_busy = (b1 - b0) / (t1 - t0)
            if trial.worker_cpu_us_per_job is not None:
                workers = trial.worker_cpu_us_per_job * trial.jobs / 1e6 / trial.window_s
                cores = os.cpu_count() or 1
                trial.other_cores = trial.machine_busy * cores - workers - trial.redis_core_share
        if trial.worker_cpu_us_per_job is not None and trial.redis_cpu_us_per_job is not None:
            per_job = trial.worker_cpu_us_per_job + trial.redis_cpu_us_per_job
            trial.cpu_ceiling_jobs_per_s = (os.cpu_count() or 1) * 1e6 / per_job
        return trial


FIGURES = (
    "jobs_per_s",
    "wall_jobs_per_s",
    "worker_cpu_us_per_job",
    "redis_cpu_us_per_job",
    "redis_core_share",
    "machine_busy",
    "other_cores",
    "busy_before",
    "cpu_ceiling_jobs_per_s",
    "enqueue_per_s",
)


def summarise(
    variants: list[Variant], trials: list[Trial], *, quiet: bool = False
) -> list[dict[str, Any]]:
    """Per variant: the median of every figure over its good trials (with ``quiet``: only
    those that were not noisy), with min and max."""
    rows = []
    for v in variants:
        good = [t for t in trials if t.variant == v.name and t.error is None]
        if quiet:
            good = [t for t in good if not t.noisy]
        row: dict[str, Any] = {"variant": v.name, **asdict(v), "trials": len(good)}
        row["errors"] = [t.error for t in trials if t.variant == v.name and t.error]
        row["noisy_trials"] = sum(t.noisy for t in good)
        for figure in FIGURES:
            values = [getattr(t, figure) for t in good if getattr(t, figure) is not None]
            if values:
                row[figure] = statistics.median(values)
                row[f"{figure}_min"], row[f"{figure}_max"] = min(values), max(values)
        rows.append(row)
    base = {
        r["loop"]: r.get("jobs_per_s") for r in rows if r["peer"] is None and r["processes"] == 1
    }
    for r in rows:
        one = base.get(r["loop"]) if r["peer"] is None else None
        r["vs_one_process"] = r["jobs_per_s"] / one if one and r.get("jobs_per_s") else None
    aqw1 = base.get("asyncio")
    for r in rows:
        r["vs_aqw_x1_asyncio"] = r["jobs_per_s"] / aqw1 if aqw1 and r.get("jobs_per_s") else None
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    def f(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    head = "| variant | jobs/s (min-max) | x one process | wall jobs/s | worker CPU/job"
    head += " | Redis CPU/job | Redis core | machine busy | other cores | CPU ceiling | trials |"
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        rate = f"{f(r.get('jobs_per_s'), ',.0f')} ({f(r.get('jobs_per_s_min'), ',.0f')}"
        rate += f"-{f(r.get('jobs_per_s_max'), ',.0f')})"
        share = r.get("redis_core_share")
        busy = r.get("machine_busy")
        lines.append(
            f"| {r['variant']} | {rate} | {f(r.get('vs_one_process'), '.2f')} "
            f"| {f(r.get('wall_jobs_per_s'), ',.0f')} "
            f"| {f(r.get('worker_cpu_us_per_job'), '.0f')} us "
            f"| {f(r.get('redis_cpu_us_per_job'), '.1f')} us "
            f"| {'-' if share is None else f'{share:.0%}'} "
            f"| {'-' if busy is None else f'{busy:.0%}'} "
            f"| {f(r.get('other_cores'), '.2f')} "
            f"| {f(r.get('cpu_ceiling_jobs_per_s'), ',.0f')} "
            f"| {r['trials']}{f' ({noisy} noisy)' if (noisy := r['noisy_trials']) else ''} |"
        )
    return "\n".join(lines)


def probe_aqw(python: str, cwd: str) -> tuple[str, str]:
    """(aqw's package directory, version) as ``python`` imports it from ``cwd``."""
    code = (
        "import aqw, json, os; print(json.dumps([os.path.dirname(aqw.__file__), aqw.__version__]))"
    )
    out = subprocess.run(
        [python, "-P", "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60
    )
    if out.returncode != 0:
        raise SystemExit(f"scaling_bench: {python} cannot import aqw: {out.stderr.strip()}")
    found = json.loads(out.stdout)
    return str(found[0]), str(found[1])


def has_uvloop(python: str) -> bool:
    out = subprocess.run([python, "-c", "import uvloop"], capture_output=True, timeout=60)
    return out.returncode == 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("role", nargs="?", default="run", help="run (default), or summary")
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=100)
    p.add_argument("--trials", type=int, default=3, help="interleaved rounds (median)")
    p.add_argument("--max-processes", type=int, default=os.cpu_count() or 1)
    p.add_argument("--loops", default="asyncio", help="asyncio,uvloop: the loops to measure")
    p.add_argument("--peers", default="", help="e.g. aqw,raw-streams,taskiq-redis")
    p.add_argument("--python", default=None, help="runs aqw worker (default: the aqw peer venv's)")
    p.add_argument("--redis-url", help="default: a private redis-server on a free port")
    p.add_argument("--timeout", type=float, default=900.0, help="start no trial after this")
    p.add_argument(
        "--quiet-cores",
        type=float,
        default=0.3,
        help="before a trial, wait for a second with at most this many cores busy (0.3)",
    )
    p.add_argument("--quiet-wait", type=float, default=10.0, help="but no longer than this (10 s)")
    p.add_argument(
        "--noisy-cores",
        type=float,
        default=0.3,
        help="a trial during which other processes took more cores than this is noisy (0.3)",
    )
    p.add_argument("--retries", type=int, default=2, help="attempts more for a noisy trial (2)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--peer", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.role == "_produce":
        print(json.dumps(asyncio.run(produce(args.jobs))))
        return
    if args.role.startswith("_peer_"):
        sys.path.insert(0, str(PEERS_DIR))
    if args.role == "_peer_produce":
        print(json.dumps(asyncio.run(peer_produce(args.peer, args.url, args.jobs))))
        return
    if args.role == "_peer_drain":
        result = asyncio.run(peer_drain(args.peer, args.url, args.jobs, args.concurrency))
        print(json.dumps(result))
        return
    if args.role == "summary":
        resummarise(args.out)
        return
    if args.role != "run":
        raise SystemExit(f"unknown role {args.role!r}")
    run(args)


def resummarise(path: Path) -> None:
    """``scaling_bench.py summary --out FILE``: the summaries and tables of an earlier run's
    JSON, computed again from its trials (and written back into it)."""
    report = json.loads(path.read_text())
    fields = {f for f in Trial.__dataclass_fields__}
    trials = [Trial(**{k: v for k, v in t.items() if k in fields}) for t in report["trials"]]
    variants = [Variant(r["processes"], r["loop"], r["peer"]) for r in report["summary"]]
    report["summary"] = summarise(variants, trials)
    report["summary_quiet"] = summarise(variants, trials, quiet=True)
    print(render(report["summary"]))
    print(f"\nquiet trials only (other processes took at most {report['noisy_cores']:g} cores):")
    print(render(report["summary_quiet"]))
    path.write_text(json.dumps(report, indent=1) + "\n")


def attempt_trial(runner: Runner, v: Variant, rnd: int, args: argparse.Namespace) -> list[Trial]:
    """One trial of ``v``, tried again (``--retries`` times at most) while other processes
    took more than ``--noisy-cores`` cores during its window; every attempt, in order."""
    tried: list[Trial] = []
    for attempt in range(1, args.retries + 2):
        t = runner.trial(v, rnd)
        t.attempt = attempt
        t.noisy = t.other_cores is not None and t.other_cores > args.noisy_cores
        tried.append(t)
        rate = "-" if t.jobs_per_s is None else f"{t.jobs_per_s:,.0f}"
        busy = "-" if t.machine_busy is None else f"{t.machine_busy:.0%}"
        other = "-" if t.other_cores is None else f"{t.other_cores:.2f}"
        print(
            f"round {rnd} {v.name:<28} {rate:>8} jobs/s  machine busy {busy}"
            f"  other cores {other}"
            + (" (noisy)" if t.noisy else "")
            + (f"  ERROR {t.error}" if t.error else ""),
            file=sys.stderr,
            flush=True,
        )
        if not t.noisy:
            break
    return tried


def run(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(HERE))
    from run_peers import PEERS

    pythons = {peer.name: str(peer.python) for peer in PEERS}
    if args.python is None:
        args.python = pythons["aqw"] if Path(pythons["aqw"]).exists() else sys.executable
    peers = [p for p in args.peers.split(",") if p]
    args.peer_python = {}
    for peer in peers:
        if peer not in ("aqw", "raw-streams", "taskiq-redis"):
            raise SystemExit(f"--peers: aqw, raw-streams or taskiq-redis, not {peer!r}")
        if not Path(pythons[peer]).exists():
            raise SystemExit(f"--peers {peer}: no {pythons[peer]} (run setup_peers.sh)")
        args.peer_python[peer] = pythons[peer]
    loops = [loop for loop in args.loops.split(",") if loop]
    workdir = tempfile.mkdtemp(prefix="aqw-scaling-")
    args.aqw_dir, version = probe_aqw(args.python, workdir)
    if "uvloop" in loops and not has_uvloop(args.python):
        raise SystemExit(f"--loops uvloop: {args.python} has no uvloop (pip install uvloop)")
    variants = [Variant(n, loop) for loop in loops for n in range(1, args.max_processes + 1)]
    variants += [Variant(peer=peer) for peer in peers]

    server = None
    if args.redis_url:
        if urlsplit(args.redis_url).path.strip("/") in ("", "0"):
            raise SystemExit("--redis-url: name a database other than 0 (it is flushed)")
        url, redis_version = args.redis_url, "?"
    else:
        server = PrivateRedis()
        url, redis_version = server.url, server.version
    runner = Runner(args, url, workdir)
    load_before = os.getloadavg()
    began = time.monotonic()
    trials: list[Trial] = []
    attempts: list[Trial] = []
    try:
        for rnd in range(args.trials):
            shift = rnd % len(variants)
            for v in variants[shift:] + variants[:shift]:
                if time.monotonic() - began > args.timeout:
                    print(f"--timeout {args.timeout:g}s reached: stopping", file=sys.stderr)
                    break
                tried = attempt_trial(runner, v, rnd + 1, args)
                attempts += tried
                trials.append(min(tried, key=lambda t: t.other_cores or 0.0))
    except KeyboardInterrupt:
        print("interrupted: the trials so far", file=sys.stderr)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    rows, quiet = summarise(variants, trials), summarise(variants, trials, quiet=True)
    print(render(rows))
    print(f"\nquiet trials only (other processes took at most {args.noisy_cores:g} cores):")
    print(render(quiet))
    report = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": "python " + " ".join(sys.argv),
        "host": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "redis": redis_version,
            "redis_url": url,
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "wall_s": round(time.monotonic() - began, 1),
        },
        "aqw": {"python": args.python, "dir": args.aqw_dir, "version": version},
        "jobs": args.jobs,
        "concurrency": args.concurrency,
        "trials_per_variant": args.trials,
        "summary": rows,
        "summary_quiet": quiet,
        "noisy_cores": args.noisy_cores,
        "trials": [asdict(t) for t in trials],
        "attempts": [asdict(t) for t in attempts],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
