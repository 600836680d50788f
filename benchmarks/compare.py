"""The whole peer comparison in one command: measure, chart, and write docs/benchmarks.md.

Run it through ``benchmarks/compare.sh``, which first runs ``setup_peers.sh`` (so aqw is
reinstalled from this working tree into its peer venv) and then this script with the
runner venv's python::

    bash benchmarks/compare.sh [--quick] [--with-sqs] [--repeat N] [--only aqw arq ...]

Steps, each bounded in time:

1. for every scenario, work {noop, sleep 10 ms} x worker concurrency {10, 100}:
   ``run_peers.py`` runs every peer (aqw, raw-streams, arq, taskiq-redis, saq, streaq) with
   the same ``_bench.py`` arguments, repeats interleaved round-robin so machine noise hits
   everyone alike; each figure is the median of ``--repeat`` runs;
2. ``aqw_extra.py`` (aqw-only: enqueue vs enqueue_many, telemetry off/on/10% sampled,
   memory://) and, with ``--with-sqs``, ``sqs_bench.py`` (SQS on fauxqs), run by a python
   where ``import aqw`` is this working tree (``--aqw-python``, default: the first of
   ``$AQW_PYTHON``, ``.venv/bin/python``, ``python3`` on PATH that imports it);
3. writes ``benchmarks/results/compare.json`` (everything, with per-step outputs under
   ``benchmarks/results/compare/``), the chart ``docs/img/benchmarks.png`` and
   ``docs/benchmarks.md`` from the template ``benchmarks/benchmarks.md.in``.

Redis: 127.0.0.1:6379, db 13 only (flushed before and after; db 0 is never touched).
The load average is recorded before and after every step.

``--quick`` (fewer jobs, one repeat, ~3-5 minutes) is a smoke test of the whole pipeline;
its page says so.  The full run takes ~20 minutes on a 2-core machine (most of it
in the slower peers' runs: preloading 20,000 jobs one enqueue at a time, and drains
capped at 15 s).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from string import Template
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
STEPS = RESULTS / "compare"
OUT_JSON = RESULTS / "compare.json"
DOC = ROOT / "docs" / "benchmarks.md"
PNG = ROOT / "docs" / "img" / "benchmarks.png"
TEMPLATE = HERE / "benchmarks.md.in"
PEER_VENVS = HERE / ".venv-peers" / "peers"

sys.path.insert(0, str(HERE / "peers"))
from _bench import DEFAULT_DB, REDIS_HOST, REDIS_PORT, flush_db  # noqa: E402

#: display order (run_peers.py runs them in its own order, rotated every round)
PEERS = ("aqw", "raw-streams", "arq", "taskiq-redis", "saq", "streaq")
SLEEP_MS = 10.0
NOOP_RATE = 500.0


@dataclass(frozen=True)
class Plan:
    """Sizes for one mode: each run short, the whole comparison bounded."""

    name: str
    repeat: int
    noop_jobs: int
    sleep_jobs: dict[int, int]  # concurrency -> jobs
    enqueue_jobs: int
    duration: float  # latency phase, seconds
    drain_max_s: float  # a peer slower than this stops counting (rate = done / cap)
    # not caught up this long after the last offer: saturated (a peer that keeps up is done
    # within its fetch cycle, at most ~0.5 s, arq's poll interval)
    latency_max_wait: float
    phase_timeout: float
    run_timeout: float  # one peer run, whole script
    extra_jobs: int
    extra_repeat: int
    sqs_messages: int
    sqs_rounds: int


FULL = Plan(
    name="full",
    repeat=3,
    noop_jobs=20_000,
    sleep_jobs={10: 2_000, 100: 10_000},
    enqueue_jobs=2_000,
    duration=5.0,
    drain_max_s=15.0,
    latency_max_wait=3.0,
    phase_timeout=90.0,
    run_timeout=240.0,
    extra_jobs=20_000,
    extra_repeat=3,
    sqs_messages=5_000,
    sqs_rounds=3,
)
QUICK = Plan(
    name="quick",
    repeat=1,
    noop_jobs=5_000,
    sleep_jobs={10: 1_000, 100: 3_000},
    enqueue_jobs=1_000,
    duration=2.0,
    drain_max_s=10.0,
    latency_max_wait=2.0,
    phase_timeout=60.0,
    run_timeout=150.0,
    extra_jobs=5_000,
    extra_repeat=1,
    sqs_messages=1_000,
    sqs_rounds=1,
)


@dataclass(frozen=True)
class Scenario:
    work: str  # "noop" | "sleep"
    concurrency: int
    jobs: int
    rate: float

    @property
    def key(self) -> str:
        return f"{self.work}-c{self.concurrency}"

    @property
    def work_label(self) -> str:
        return "no-op" if self.work == "noop" else f"sleep {SLEEP_MS:g} ms"

    @property
    def label(self) -> str:
        return f"{self.work_label}, concurrency {self.concurrency}"

    @property
    def short(self) -> str:
        return f"{self.work_label}, c={self.concurrency}"


def latency_rate(work: str, concurrency: int) -> float:
    """Offered rate for the latency phase: 500/s, or half the ideal capacity when lower."""
    if work == "noop":
        return NOOP_RATE
    return min(NOOP_RATE, 0.5 * concurrency / (SLEEP_MS / 1e3))


def scenarios(plan: Plan) -> list[Scenario]:
    out = []
    for work in ("noop", "sleep"):
        for conc in (10, 100):
            jobs = plan.noop_jobs if work == "noop" else plan.sleep_jobs[conc]
            out.append(Scenario(work, conc, jobs, latency_rate(work, conc)))
    return out


# -- helpers ---------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def rel(path: Path) -> str:
    """``path`` relative to the repository root (every step runs there)."""
    return str(path.relative_to(ROOT))


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_bounded(cmd: list[str], timeout: float, what: str) -> tuple[int, float]:
    """Run ``cmd`` (output passed through) in its own process group; kill it at ``timeout``."""
    log(f"{what}: {shlex.join(cmd)}")
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        log(f"{what}: killed after {timeout:.0f}s")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        code = -9
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return code, round(time.monotonic() - started, 1)


def source_digest(package_dir: Path) -> str:
    """sha256 over aqw's .py and .lua files (relative path + bytes), first 12 hex digits."""
    h = hashlib.sha256()
    for path in sorted(package_dir.rglob("*")):
        if path.suffix in (".py", ".lua") and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(package_dir)).encode() + b"\0")
            h.update(path.read_bytes())
    return h.hexdigest()[:12]


def probe(python: str, code: str) -> dict[str, Any] | None:
    try:
        out = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        found: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return None
    return found


AQW_PROBE = (
    "import json, os, aqw, redis, opentelemetry.sdk, platform; "
    "print(json.dumps({'dir': os.path.dirname(os.path.abspath(aqw.__file__)), "
    "'python': platform.python_version()}))"
)


def find_aqw_python(explicit: str | None) -> tuple[str, dict[str, Any]]:
    """A python where ``import aqw`` is this working tree and the OTel SDK is installed."""
    candidates = [explicit] if explicit else []
    candidates += [os.environ.get("AQW_PYTHON"), str(ROOT / ".venv" / "bin" / "python")]
    candidates += ["python3", "python"]
    for cand in candidates:
        if not cand:
            continue
        info = probe(cand, AQW_PROBE)
        if info and Path(info["dir"]) == ROOT / "aqw":
            return cand, info
        if explicit:
            break
    raise SystemExit(
        "compare: no python imports aqw from this working tree with opentelemetry-sdk;"
        " run `pip install -e '.[otel,sqs]'` or pass --aqw-python"
    )


def peer_aqw_digest() -> dict[str, Any]:
    """Where and what aqw is in the aqw peer venv, against the working tree."""
    python = PEER_VENVS / "aqw" / "bin" / "python"
    info = probe(
        str(python),
        "import json, os, aqw; print(json.dumps({'dir': os.path.dirname(aqw.__file__)}))",
    )
    tree = source_digest(ROOT / "aqw")
    if info is None:
        return {"tree": tree, "peer_venv": None, "matches": False}
    venv = source_digest(Path(info["dir"]))
    return {"tree": tree, "peer_venv": venv, "matches": venv == tree}


def redis_version() -> str:
    import redis

    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=DEFAULT_DB, socket_timeout=5)
    try:
        return str(client.info("server").get("redis_version", "?"))
    finally:
        client.close()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def virtualised() -> bool:
    try:
        return " hypervisor" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


# -- steps -----------------------------------------------------------------------------------


def run_scenario(sc: Scenario, plan: Plan, repeat: int, only: list[str] | None) -> dict[str, Any]:
    out = STEPS / f"peers-{sc.key}.json"
    out.unlink(missing_ok=True)
    bench = [
        "--jobs",
        str(sc.jobs),
        "--enqueue-jobs",
        str(plan.enqueue_jobs),
        "--rate",
        f"{sc.rate:g}",
        "--duration",
        f"{plan.duration:g}",
        "--concurrency",
        str(sc.concurrency),
        "--work",
        sc.work,
        "--drain-max-s",
        f"{plan.drain_max_s:g}",
        "--latency-max-wait",
        f"{plan.latency_max_wait:g}",
        "--phase-timeout",
        f"{plan.phase_timeout:g}",
        "--total-timeout",
        f"{plan.run_timeout - 30:g}",
        "--db",
        str(DEFAULT_DB),
    ]
    if sc.work == "sleep":
        bench += ["--sleep-ms", f"{SLEEP_MS:g}"]
    cmd = [sys.executable, rel(HERE / "run_peers.py"), "--repeat", str(repeat)]
    cmd += ["--timeout", f"{plan.run_timeout:g}", "--out", rel(out)]
    if only:
        cmd += ["--only", *only]
    cmd += ["--", *bench]
    n_peers = len(only) if only else len(PEERS)
    limit = n_peers * repeat * (plan.run_timeout + 30) + 120
    load_before = loadavg()
    code, elapsed = run_bounded(cmd, limit, f"scenario {sc.label}")
    step: dict[str, Any] = {
        "scenario": asdict(sc) | {"key": sc.key, "label": sc.label},
        "exit": code,
        "elapsed_s": elapsed,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "bench_args": bench,
    }
    if out.exists():
        step["report"] = json.loads(out.read_text())
    else:
        step["error"] = f"run_peers.py wrote no results (exit {code})"
    return step


def run_extra(python: str, plan: Plan, repeat: int) -> dict[str, Any]:
    out = STEPS / "aqw_extra.json"
    out.unlink(missing_ok=True)
    cmd = [python, rel(HERE / "aqw_extra.py"), "--jobs", str(plan.extra_jobs)]
    cmd += ["--repeat", str(repeat), "--out", rel(out), "--timeout", "900"]
    load_before = loadavg()
    code, elapsed = run_bounded(cmd, 960, "aqw_extra")
    step: dict[str, Any] = {
        "exit": code,
        "elapsed_s": elapsed,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "command": "python " + shlex.join(cmd[1:]),
    }
    if out.exists():
        step["result"] = json.loads(out.read_text())
    else:
        step["error"] = f"aqw_extra.py wrote no results (exit {code})"
    return step


def run_sqs(python: str, plan: Plan, rounds: int) -> dict[str, Any]:
    out = STEPS / "sqs.json"
    out.unlink(missing_ok=True)
    cmd = [python, rel(HERE / "sqs_bench.py"), "--messages", str(plan.sqs_messages)]
    cmd += ["--rounds", str(rounds), "--json", rel(out)]
    load_before = loadavg()
    code, elapsed = run_bounded(cmd, 900, "sqs_bench")
    step: dict[str, Any] = {
        "exit": code,
        "elapsed_s": elapsed,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "command": "python " + shlex.join(cmd[1:]),
    }
    if out.exists():
        step["result"] = json.loads(out.read_text())
    else:
        step["error"] = f"sqs_bench.py wrote no results (exit {code})"
    return step


# -- tables ----------------------------------------------------------------------------------


def num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def fmt_rate(value: Any) -> str:
    v = num(value)
    if v is None:
        return "-"
    return f"{v:,.0f}" if v >= 10 else f"{v:.1f}"


def fmt_ms(value: Any) -> str:
    v = num(value)
    if v is None:
        return "-"
    if v < 10:
        return f"{v:.2f}"
    return f"{v:.1f}" if v < 100 else f"{v:,.0f}"


def fmt_ratio(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}x"


def md_table(head: list[str], rows: list[list[str]], align: str) -> str:
    """``align``: one of l/r per column."""
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = [head, rule, *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def rows_by_peer(step: dict[str, Any]) -> dict[str, dict[str, Any]]:
    report = step.get("report") or {}
    return {r["name"]: r for r in report.get("results", [])}


class Marks:
    """Footnote markers for capped drains, saturated latencies and errors."""

    def __init__(self) -> None:
        self.capped = False
        self.saturated = False
        self.errors: list[str] = []

    def drain(self, row: dict[str, Any] | None) -> str:
        if row is None or "skipped" in row:
            return "not run"
        text = fmt_rate(row.get("drain_jobs_per_s"))
        if "drain: " in (row.get("note") or ""):
            self.capped = True
            text += " (capped)"
        return self.flag_error(row, text)

    def latency(self, row: dict[str, Any] | None) -> str:
        if row is None or "skipped" in row:
            return "not run"
        if "saturated" in (row.get("note") or ""):
            self.saturated = True
            return "saturated"
        p50, p99 = row.get("latency_p50_ms"), row.get("latency_p99_ms")
        if p50 is None and p99 is None:
            return self.flag_error(row, "-")
        return self.flag_error(row, f"{fmt_ms(p50)} / {fmt_ms(p99)}")

    def enqueue(self, row: dict[str, Any] | None) -> str:
        if row is None or "skipped" in row:
            return "not run"
        return self.flag_error(row, fmt_rate(row.get("enqueue_per_s")))

    def flag_error(self, row: dict[str, Any], text: str) -> str:
        if row.get("error"):
            note = f"{row['name']}: {row['error']}"
            if note not in self.errors:
                self.errors.append(note)
            return f"{text} (error)"
        return text

    def footnotes(self, plan: Plan) -> str:
        out = []
        if self.capped:
            out.append(
                f"(capped): the peer had not drained every job after {plan.drain_max_s:g} s;"
                " its rate is the jobs it finished by then divided by the elapsed time."
            )
        if self.saturated:
            out.append(
                "saturated: the peer could not keep up with the offered rate (jobs still"
                f" waiting {plan.latency_max_wait:g} s after the last was offered), so its"
                " latency grows with the length of the run and no percentile is given."
            )
        out += [f"(error) {e}" for e in self.errors]
        return "\n".join(f"- {line}" for line in out) if out else ""


def peer_tables(steps: list[dict[str, Any]], peers: list[str], plan: Plan) -> dict[str, str]:
    marks = Marks()
    head = ["peer", *(s["scenario"]["label"] for s in steps)]
    by = [rows_by_peer(s) for s in steps]
    align = "l" + "r" * len(steps)
    drain = [[p, *(marks.drain(b.get(p)) for b in by)] for p in peers]
    latency = [[p, *(marks.latency(b.get(p)) for b in by)] for p in peers]
    enqueue = [[p, *(marks.enqueue(b.get(p)) for b in by)] for p in peers]
    return {
        "drain_table": md_table(head, drain, align),
        "latency_table": md_table(head, latency, align),
        "enqueue_table": md_table(head, enqueue, align),
        "footnotes": marks.footnotes(plan),
    }


def params_table(steps: list[dict[str, Any]], plan: Plan, repeat: int) -> str:
    rows = []
    for s in steps:
        sc = s["scenario"]
        rows.append(
            [
                sc["label"],
                f"{sc['jobs']:,}",
                f"{sc['rate']:g} jobs/s x {plan.duration:g} s",
                f"{s['elapsed_s']:.0f} s",
                " / ".join(f"{x:.2f}" for x in s["loadavg_before"]),
            ]
        )
    head = ["scenario", "drain jobs", "latency phase", "wall time", "load avg before"]
    note = (
        f"Every cell is the median of {repeat} run(s); {plan.enqueue_jobs:,} single"
        f" enqueues per run for the enqueue figure."
    )
    return md_table(head, rows, "lrrrr") + "\n\n" + note


def versions_table(steps: list[dict[str, Any]], peers: list[str]) -> str:
    seen: dict[str, dict[str, Any]] = {}
    for s in steps:
        for name, row in rows_by_peer(s).items():
            if "version" in row:
                seen.setdefault(name, row)
    rows = [[p, str(seen[p]["version"]), seen[p].get("deps") or "-"] for p in peers if p in seen]
    return md_table(["peer", "version", "client libraries"], rows, "lll")


def metric(steps: list[dict[str, Any]], key: str, peer: str, field: str) -> float | None:
    for s in steps:
        if s["scenario"]["key"] == key:
            row = rows_by_peer(s).get(peer)
            if row and not row.get("error"):
                return num(row.get(field))
    return None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def headline(data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    steps = data["scenarios"]
    figures: dict[str, Any] = {}
    rows: list[list[str]] = []

    aqw_d = metric(steps, "noop-c100", "aqw", "drain_jobs_per_s")
    taskiq_d = metric(steps, "noop-c100", "taskiq-redis", "drain_jobs_per_s")
    raw_d = metric(steps, "noop-c100", "raw-streams", "drain_jobs_per_s")
    figures["aqw_over_taskiq_drain_noop_c100"] = ratio(aqw_d, taskiq_d)
    figures["aqw_over_raw_streams_drain_noop_c100"] = ratio(aqw_d, raw_d)
    rows.append(
        [
            "aqw drain ÷ taskiq-redis drain (no-op, c=100)",
            f"{fmt_ratio(ratio(aqw_d, taskiq_d))}"
            f" ({fmt_rate(aqw_d)} vs {fmt_rate(taskiq_d)} jobs/s)",
        ]
    )
    rows.append(
        [
            "aqw drain ÷ raw-streams drain (no-op, c=100; the no-guarantees ceiling)",
            f"{fmt_ratio(ratio(aqw_d, raw_d), 2)} ({fmt_rate(aqw_d)} vs {fmt_rate(raw_d)} jobs/s)",
        ]
    )
    for conc in (100, 10):
        key = f"noop-c{conc}"
        p50 = metric(steps, key, "aqw", "latency_p50_ms")
        p99 = metric(steps, key, "aqw", "latency_p99_ms")
        figures[f"aqw_latency_noop_c{conc}_ms"] = {"p50": p50, "p99": p99}
        rows.append(
            [
                f"aqw latency at {NOOP_RATE:g} jobs/s offered (no-op, c={conc}), p50 / p99",
                f"{fmt_ms(p50)} ms / {fmt_ms(p99)} ms",
            ]
        )

    extra = (data.get("aqw_extra") or {}).get("result")
    if extra:
        on, s10 = extra["telemetry_on_over_off"], extra["telemetry_sampled_10_over_off"]
        frac = extra.get("sampled_fraction", {})
        figures["telemetry_on_over_off"] = on
        figures["telemetry_sampled_10_over_off"] = s10
        figures["enqueue_many_over_single"] = extra["enqueue_many_over_single"]
        rows.append(
            [
                "aqw drain, telemetry on (100% of traces sampled) ÷ off",
                f"{100 * on:.0f}% ({fmt_rate(extra['drain_telemetry_on'])} vs"
                f" {fmt_rate(extra['drain_telemetry_off'])} jobs/s)",
            ]
        )
        rows.append(
            [
                "aqw drain, telemetry on (10% of traces sampled) ÷ off",
                f"{100 * s10:.0f}% ({fmt_rate(extra['drain_telemetry_sampled_10'])} jobs/s;"
                f" {100 * frac.get('sampled_10', 0):.1f}% of jobs actually sampled)",
            ]
        )
        rows.append(
            [
                "aqw enqueue_many (batches of 1,000) ÷ single awaited enqueue",
                f"{fmt_ratio(extra['enqueue_many_over_single'])}"
                f" ({fmt_rate(extra['enqueue_many_per_s'])} vs"
                f" {fmt_rate(extra['enqueue_single_per_s'])} jobs/s)",
            ]
        )
    else:
        rows.append(["aqw telemetry and enqueue_many figures", "not measured (aqw_extra failed)"])

    sqs = (data.get("sqs") or {}).get("result")
    if sqs:
        figures["sqs_batched_over_naive"] = sqs["speedup"]
        rows.append(
            [
                f"SQS drain (fauxqs): aqw batched, c={sqs['concurrency']}"
                " ÷ naive receive-1/delete-1",
                f"{sqs['speedup']:.1f}x ({sqs['drain_msgs_per_s']['aqw']:,} vs"
                f" {sqs['drain_msgs_per_s']['naive']:,} msg/s)",
            ]
        )
    elif data.get("sqs") is None:
        rows.append(["SQS batched ÷ naive", "not run this time (add `--with-sqs`)"])
    else:
        rows.append(["SQS batched ÷ naive", "failed this time, see compare.json"])
    return md_table(["what", "figure"], rows, "ll"), figures


def extra_table(data: dict[str, Any]) -> str:
    step = data.get("aqw_extra") or {}
    extra = step.get("result")
    if not extra:
        return f"Not measured: {step.get('error', 'aqw_extra.py did not run')}."
    frac = extra.get("sampled_fraction", {})
    off = extra["drain_telemetry_off"]
    rows = [
        ["enqueue, single awaited", fmt_rate(extra["enqueue_single_per_s"]), ""],
        [
            "enqueue_many, batches of 1,000",
            fmt_rate(extra["enqueue_many_per_s"]),
            fmt_ratio(extra["enqueue_many_over_single"]) + " single",
        ],
        ["drain, telemetry off", fmt_rate(off), "100%"],
        [
            "drain, telemetry on, 100% of traces sampled",
            fmt_rate(extra["drain_telemetry_on"]),
            f"{100 * extra['telemetry_on_over_off']:.0f}% of off"
            f" ({100 * frac.get('on', 0):.0f}% sampled)",
        ],
        [
            "drain, telemetry on, 10% of traces sampled",
            fmt_rate(extra["drain_telemetry_sampled_10"]),
            f"{100 * extra['telemetry_sampled_10_over_off']:.0f}% of off"
            f" ({100 * frac.get('sampled_10', 0):.1f}% sampled)",
        ],
        [
            "drain, memory:// broker",
            fmt_rate(extra["drain_memory"]),
            f"{extra['drain_memory'] / off:.1f}x Redis",
        ],
    ]
    note = (
        f"{extra['jobs']:,} no-op jobs per drain at concurrency {extra.get('concurrency', 100)},"
        f" median of {extra['repeat']} interleaved run(s); command: `{step['command']}`."
    )
    return md_table(["aqw only", "jobs/s", "relative"], rows, "lrr") + "\n\n" + note


def sqs_section(data: dict[str, Any]) -> str:
    step = data.get("sqs")
    if step is None:
        return (
            "Not part of this run. `bash benchmarks/compare.sh --with-sqs` adds it: aqw's"
            " SQS broker (batched, concurrent receives, `DeleteMessageBatch` acks) against a"
            " naive receive-one/delete-one loop, on the fauxqs SQS emulator (`sqs_bench.py`)."
        )
    sqs = step.get("result")
    if not sqs:
        return f"The SQS step failed: {step.get('error', '?')}."
    rows = [
        [
            f"aqw SQS broker, concurrency {sqs['concurrency']}",
            f"{sqs['drain_msgs_per_s']['aqw']:,}",
        ],
        ["naive ReceiveMessage(1) + DeleteMessage loop", f"{sqs['drain_msgs_per_s']['naive']:,}"],
        ["speedup", f"{sqs['speedup']:.1f}x"],
    ]
    note = (
        f"{sqs['messages']:,} messages per drain on {sqs['server']}, median of"
        f" {sqs['rounds']} round(s), contenders alternating; command: `{step['command']}`."
    )
    return md_table(["SQS drain", "msg/s"], rows, "lr") + "\n\n" + note


# -- chart -----------------------------------------------------------------------------------


def chart(data: dict[str, Any], peers: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}")
    steps = data["scenarios"]
    colors = dict(zip(PEERS, plt.get_cmap("tab10").colors, strict=False))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.6), gridspec_kw={"width_ratios": [3, 2]})

    # drain: groups = scenarios, one bar per peer
    width = 0.8 / max(1, len(peers))
    for i, peer in enumerate(peers):
        xs, ys, capped = [], [], []
        for g, step in enumerate(steps):
            row = rows_by_peer(step).get(peer) or {}
            v = num(row.get("drain_jobs_per_s"))
            if v:
                xs.append(g - 0.4 + width * (i + 0.5))
                ys.append(v)
                capped.append("drain: " in (row.get("note") or ""))
        bars = ax1.bar(xs, ys, width, label=peer, color=colors.get(peer))
        for bar, cap, y in zip(bars, capped, ys, strict=True):
            if cap:
                bar.set_hatch("//")
            ax1.annotate(
                f"{y:,.0f}",
                (bar.get_x() + bar.get_width() / 2, y),
                ha="center",
                va="bottom",
                fontsize=6,
                rotation=90,
            )
    ax1.set_xticks(range(len(steps)), [s["scenario"]["label"].replace(", ", "\n") for s in steps])
    ax1.set_yscale("log")
    ax1.yaxis.set_major_formatter(plain)
    ax1.margins(y=0.25)
    ax1.set_ylabel("jobs/s (log)")
    ax1.set_title("drain rate, higher is better (hatched: capped, see table)", fontsize=10)
    ax1.legend(fontsize=8, ncol=3)
    ax1.grid(axis="y", which="both", alpha=0.3)

    # latency at 500/s, no-op: groups = peers, bars p50/p99 at c=10 and c=100
    series = [
        ("noop-c10", "latency_p50_ms", "p50, c=10"),
        ("noop-c10", "latency_p99_ms", "p99, c=10"),
        ("noop-c100", "latency_p50_ms", "p50, c=100"),
        ("noop-c100", "latency_p99_ms", "p99, c=100"),
    ]
    shades = ["#9ecae1", "#3182bd", "#fdae6b", "#e6550d"]
    width = 0.8 / len(series)
    for j, (key, field, label) in enumerate(series):
        xs, ys = [], []
        for g, peer in enumerate(peers):
            x = g - 0.4 + width * (j + 0.5)
            v = metric(steps, key, peer, field)
            if v:
                xs.append(x)
                ys.append(v)
                continue
            step = next((s for s in steps if s["scenario"]["key"] == key), {})
            note = (rows_by_peer(step).get(peer) or {}).get("note") or ""
            missing = "saturated" if "saturated" in note else "n/a"
            ax2.annotate(
                missing,
                (x, 0.02),
                xycoords=("data", "axes fraction"),
                ha="center",
                va="bottom",
                fontsize=6,
                rotation=90,
                color="#555555",
            )
        bars = ax2.bar(xs, ys, width, label=label, color=shades[j])
        for bar, y in zip(bars, ys, strict=True):
            ax2.annotate(
                fmt_ms(y),
                (bar.get_x() + bar.get_width() / 2, y),
                ha="center",
                va="bottom",
                fontsize=6,
                rotation=90,
            )
    ax2.set_xticks(range(len(peers)), peers, rotation=30, fontsize=8)
    ax2.set_yscale("log")
    ax2.yaxis.set_major_formatter(plain)
    ax2.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax2.margins(y=0.25)
    ax2.set_ylabel("ms (log)")
    ax2.set_title(f"latency at {NOOP_RATE:g} jobs/s offered, no-op, lower is better", fontsize=10)
    ax2.legend(fontsize=8)
    ax2.grid(axis="y", which="both", alpha=0.3)

    mode = "" if data["plan"]["name"] == "full" else "  [--quick smoke run: not for quoting]"
    fig.suptitle(f"aqw and peers on Redis, {data['generated_at'][:10]}{mode}", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- document --------------------------------------------------------------------------------


def render_doc(data: dict[str, Any], peers: list[str]) -> str:
    plan = Plan(**data["plan"])
    steps = data["scenarios"]
    machine = data["machine"]
    headline_md, _ = headline(data)
    tables = peer_tables(steps, peers, plan)
    if plan.name == "quick":
        mode_note = (
            '!!! warning "Smoke run"\n'
            "    These figures come from `--quick` (fewer jobs, one run per cell) on a busy\n"
            "    machine. They show that the pipeline works, not how fast anything is: run\n"
            "    the full comparison on a quiet machine before quoting a number.\n"
        )
    else:
        mode_note = ""
    digest = data["aqw_source"]
    if digest["matches"]:
        source_note = (
            f"aqw measured: the working tree (sources digest `{digest['tree']}`),"
            " reinstalled into its peer venv by `setup_peers.sh` before the run."
        )
        if data.get("source_after") not in (None, digest["tree"]):
            source_note += (
                f" The working tree changed during the run (digest `{data['source_after']}` at"
                " the end): the aqw-only figures may have measured the newer code."
            )
    else:
        source_note = (
            f"**aqw in the peer venv (`{digest['peer_venv']}`) did not match the working tree"
            f" (`{digest['tree']}`) when the run started**: re-run `benchmarks/compare.sh`."
        )
    lb, la = machine["loadavg_before"], machine["loadavg_after"]
    machine_rows = [
        ["CPUs", f"{machine['cpus']} ({machine['cpu_model']})"],
        ["host", machine["kind"]],
        ["OS", machine["platform"]],
        ["Python (peers / aqw extra)", f"{machine['python']} / {machine['aqw_python_version']}"],
        ["Redis", f"{machine['redis']} on 127.0.0.1, db {DEFAULT_DB}, same machine"],
        ["load average (1/5/15 min) before", " / ".join(f"{x:.2f}" for x in lb)],
        ["load average (1/5/15 min) after", " / ".join(f"{x:.2f}" for x in la)],
        ["wall time of the whole run", f"{data['elapsed_s'] / 60:.1f} min"],
    ]
    values = {
        "mode_note": mode_note,
        "command": data["command"],
        "generated_at": data["generated_at"],
        "mode": plan.name,
        "repeat": str(data["repeat"]),
        "machine_table": md_table(["machine", "this run"], machine_rows, "ll"),
        "source_note": source_note,
        "headline_table": headline_md,
        "params_table": params_table(steps, plan, data["repeat"]),
        "drain_max_s": f"{plan.drain_max_s:g}",
        "latency_max_wait": f"{plan.latency_max_wait:g}",
        "extra_table": extra_table(data),
        "sqs_section": sqs_section(data),
        "versions_table": versions_table(steps, peers),
        **tables,
    }
    if not values["footnotes"]:
        values["footnotes"] = "- Every peer drained every job and kept up with every offered rate."
    return Template(TEMPLATE.read_text()).substitute(values)


# -- main ------------------------------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="smoke run: fewer jobs, 1 repeat")
    p.add_argument("--with-sqs", action="store_true", help="also run sqs_bench.py (fauxqs)")
    p.add_argument("--repeat", type=int, help="runs per cell (default: 3, --quick: 1)")
    p.add_argument("--only", nargs="+", metavar="PEER", choices=PEERS, help="a subset of peers")
    p.add_argument("--aqw-python", help="python for aqw_extra.py / sqs_bench.py")
    p.add_argument(
        "--render-only",
        action="store_true",
        help="re-write the chart and docs/benchmarks.md from results/compare.json",
    )
    args = p.parse_args()

    peers = list(args.only) if args.only else list(PEERS)
    if args.render_only:
        data = json.loads(OUT_JSON.read_text())
        peers = [x for x in PEERS if x in data["peers"]]
        chart(data, peers, PNG)
        DOC.write_text(render_doc(data, peers))
        log(f"wrote {PNG} and {DOC}")
        return 0

    plan = QUICK if args.quick else FULL
    repeat = args.repeat or plan.repeat
    if repeat < 1:
        p.error("--repeat must be positive")
    started = time.monotonic()
    STEPS.mkdir(parents=True, exist_ok=True)
    aqw_python, aqw_info = find_aqw_python(args.aqw_python)
    source = peer_aqw_digest()
    if not source["matches"]:
        log(
            f"WARNING: aqw in the peer venv ({source['peer_venv']}) differs from the working"
            f" tree ({source['tree']}); run benchmarks/setup_peers.sh (compare.sh does)"
        )
    asyncio.run(flush_db(DEFAULT_DB))
    command = "bash benchmarks/compare.sh" + "".join(
        f" {a}" for a in sys.argv[1:] if a != "--render-only"
    )
    data: dict[str, Any] = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": command,
        "plan": asdict(plan),
        "repeat": repeat,
        "peers": peers,
        "aqw_source": source,
        "aqw_python": aqw_python,
        "machine": {
            "cpus": os.cpu_count(),
            "cpu_model": cpu_model(),
            "kind": (
                "virtual machine (hypervisor flag set), host shared with other workloads"
                if virtualised()
                else "bare metal or undetected hypervisor"
            ),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "aqw_python_version": aqw_info["python"],
            "redis": redis_version(),
            "loadavg_before": loadavg(),
        },
        "scenarios": [],
        "aqw_extra": None,
        "sqs": None,
    }
    try:
        for sc in scenarios(plan):
            data["scenarios"].append(run_scenario(sc, plan, repeat, args.only))
        data["aqw_extra"] = run_extra(aqw_python, plan, args.repeat or plan.extra_repeat)
        if args.with_sqs:
            data["sqs"] = run_sqs(aqw_python, plan, args.repeat or plan.sqs_rounds)
    finally:
        asyncio.run(flush_db(DEFAULT_DB))
    data["machine"]["loadavg_after"] = loadavg()
    data["elapsed_s"] = round(time.monotonic() - started, 1)
    data["source_after"] = source_digest(ROOT / "aqw")
    _, data["headline"] = headline(data)

    OUT_JSON.write_text(json.dumps(data, indent=2) + "\n")
    log(f"wrote {OUT_JSON}")
    chart(data, peers, PNG)
    log(f"wrote {PNG}")
    DOC.write_text(render_doc(data, peers))
    log(f"wrote {DOC} ({data['elapsed_s'] / 60:.1f} min in all)")
    failed = [s["scenario"]["key"] for s in data["scenarios"] if s["exit"] != 0]
    if failed:
        log(f"some peer runs reported errors: {failed} (see the tables' notes)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        asyncio.run(flush_db(DEFAULT_DB))
        sys.exit(130)
