"""Run every available peer benchmark and collect the results.

Run with the peers' runner venv (made by ``benchmarks/setup_peers.sh``)::

    benchmarks/.venv-peers/bin/python benchmarks/run_peers.py [--repeat 3] [--plot]
        [--only arq saq] [--timeout 500] [-- --jobs 20000 --rate 500 ...]

Each peer script in ``benchmarks/peers/`` runs as its own subprocess, one at a
time (they share Redis db 13 and the CPU), under its own venv's python
(``.venv-peers/peers/<name>/bin/python``; the raw redis-py baseline uses this
runner venv).  A peer whose venv is missing or doesn't import is skipped and
listed as such.  Each run is killed after ``--timeout`` seconds.  Arguments after
``--`` are passed to every peer script (see ``benchmarks/peers/_bench.py``).

Every script prints one JSON line; with ``--repeat N`` each figure is the median
of the N runs (all runs are kept).  Repeats are interleaved: round 1 runs every
peer once, then round 2, ..., each round starting one peer further along, so
machine noise (a shared VM's neighbours) hits every peer alike.  The table goes
to stdout and everything to ``benchmarks/results/peers.json`` (``--plot`` also
draws ``peers.png``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PEERS_DIR = HERE / "peers"
VENVS = HERE / ".venv-peers" / "peers"
RESULTS = HERE / "results"
METRICS = ("drain_jobs_per_s", "enqueue_per_s", "latency_p50_ms", "latency_p99_ms")

sys.path.insert(0, str(PEERS_DIR))
from _bench import DEFAULT_DB, flush_db  # noqa: E402  (stdlib-only harness module)


@dataclass(frozen=True)
class Peer:
    name: str
    script: str
    venv: str | None  # None: this (runner) interpreter
    check: str  # import statement proving the peer is installed

    @property
    def python(self) -> Path:
        if self.venv is None:
            return Path(sys.executable)
        return VENVS / self.venv / "bin" / "python"


PEERS = (
    Peer("raw-streams", "raw_streams.py", None, "import redis"),
    Peer("aqw", "peer_aqw.py", "aqw", "import aqw"),
    Peer("arq", "peer_arq.py", "arq", "import arq"),
    Peer("taskiq-redis", "peer_taskiq.py", "taskiq", "import taskiq, taskiq_redis"),
    Peer("saq", "peer_saq.py", "saq", "import saq"),
    Peer("streaq", "peer_streaq.py", "streaq", "import streaq"),
)


def available(peer: Peer) -> str | None:
    """None if the peer can run, else why not."""
    if not peer.python.exists():
        return f"no venv at {peer.python.parent.parent} (run benchmarks/setup_peers.sh)"
    probe = subprocess.run(
        [str(peer.python), "-c", peer.check], capture_output=True, text=True, timeout=60
    )
    if probe.returncode != 0:
        return f"import failed: {probe.stderr.strip().splitlines()[-1:]}"
    return None


def bench_db(extra: list[str]) -> int:
    """The Redis db the peer scripts use (``--db`` among the pass-through args)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--db", type=int, default=DEFAULT_DB)
    return int(p.parse_known_args(extra)[0].db)


def run_once(peer: Peer, extra: list[str], timeout: float) -> dict[str, Any]:
    cmd = [str(peer.python), str(PEERS_DIR / peer.script), *extra]
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=HERE.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # own process group, so a timeout kills only it
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        asyncio.run(flush_db(bench_db(extra)))  # the killed script could not clean up
        return {"name": peer.name, "error": f"killed after {timeout:.0f}s timeout"}
    elapsed = time.monotonic() - started
    lines = [line for line in out.splitlines() if line.strip()]
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = " | ".join(err.strip().splitlines()[-3:])
        return {"name": peer.name, "error": f"no JSON line (exit {proc.returncode}): {tail}"}
    result["wall_s"] = round(elapsed, 1)
    if proc.returncode != 0 and "error" not in result:
        result["error"] = f"exit {proc.returncode}"
    return result


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row: the last run's fields, each metric the median over the runs that have it."""
    row = dict(runs[-1])
    for metric in METRICS:
        values = [r[metric] for r in runs if isinstance(r.get(metric), int | float)]
        row[metric] = round(statistics.median(values), 2) if values else None
    for key in ("error", "note"):
        texts = sorted({r[key] for r in runs if r.get(key)})
        if texts:
            row[key] = "; ".join(texts)
        else:
            row.pop(key, None)
    row["runs"] = len(runs)
    return row


def fmt(value: Any, digits: int) -> str:
    if isinstance(value, int | float):
        return f"{value:,.{digits}f}"
    return "-"


def table(rows: list[dict[str, Any]]) -> str:
    head = ("peer", "drain jobs/s", "enqueue/s", "p50 ms", "p99 ms", "version", "notes")
    body = [
        (
            r["name"],
            fmt(r.get("drain_jobs_per_s"), 0),
            fmt(r.get("enqueue_per_s"), 0),
            fmt(r.get("latency_p50_ms"), 2),
            fmt(r.get("latency_p99_ms"), 2),
            str(r.get("version", "-")),
            r.get("error") or r.get("skipped") or r.get("note") or "",
        )
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
    right = {1, 2, 3, 4}

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(head), rule, *(line(b) for b in body)])


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [r for r in rows if "skipped" not in r]
    names = [r["name"] for r in ran]
    panels = (
        ("drain_jobs_per_s", "drain (jobs/s, higher is better)"),
        ("enqueue_per_s", "enqueue (jobs/s, higher is better)"),
        ("latency_p50_ms", "latency p50 (ms, log, lower is better)"),
        ("latency_p99_ms", "latency p99 (ms, log, lower is better)"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8))
    for ax, (metric, title) in zip(axes, panels, strict=True):
        values = [r.get(metric) or 0.0 for r in ran]
        ax.bar(names, values, color="#4c72b0")
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelrotation=35, labelsize=8)
        if metric.startswith("latency"):
            ax.set_yscale("log")
        for i, v in enumerate(values):
            ax.annotate(
                f"{v:,.0f}" if v >= 10 else f"{v:.2f}", (i, v), ha="center", va="bottom", fontsize=7
            )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, extra = argv[:split], argv[split + 1 :]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these peers")
    p.add_argument("--repeat", type=int, default=1, help="runs per peer; figures are medians")
    p.add_argument("--timeout", type=float, default=500.0, help="seconds per peer run")
    p.add_argument("--out", type=Path, default=RESULTS / "peers.json")
    p.add_argument("--plot", action="store_true", help="also write peers.png next to --out")
    args = p.parse_args(argv)
    known = {peer.name for peer in PEERS}
    if args.only and (unknown := set(args.only) - known):
        p.error(f"unknown peer(s) {sorted(unknown)}; known: {sorted(known)}")

    load_before = os.getloadavg()
    skipped: dict[str, str] = {}
    runnable: list[Peer] = []
    for peer in PEERS:
        if args.only and peer.name not in args.only:
            continue
        if reason := available(peer):
            print(f"[{peer.name}] skipped: {reason}", file=sys.stderr)
            skipped[peer.name] = reason
        else:
            runnable.append(peer)
    all_runs: dict[str, list[dict[str, Any]]] = {peer.name: [] for peer in runnable}
    for i in range(args.repeat):
        shift = i % len(runnable) if runnable else 0
        for peer in runnable[shift:] + runnable[:shift]:
            print(f"[{peer.name}] run {i + 1}/{args.repeat} ...", file=sys.stderr, flush=True)
            run = run_once(peer, extra, args.timeout)
            all_runs[peer.name].append(run)
            print(f"[{peer.name}] {json.dumps(run)}", file=sys.stderr, flush=True)
    rows: list[dict[str, Any]] = []
    for peer in PEERS:
        if peer.name in skipped:
            rows.append({"name": peer.name, "skipped": skipped[peer.name]})
        elif peer.name in all_runs:
            rows.append(combine(all_runs[peer.name]))

    print(table(rows))
    report = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        },
        "repeat": args.repeat,
        "script_args": extra,
        "results": rows,
        "runs": all_runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}", file=sys.stderr)
    if args.plot:
        png = args.out.with_suffix(".png")
        plot(rows, png)
        print(f"wrote {png}", file=sys.stderr)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
