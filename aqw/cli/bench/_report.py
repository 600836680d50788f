"""What ``aqw bench`` shows: the progress bar while it runs, then the results table (or JSON)
and the recommended setting."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from typing import Any
from urllib.parse import urlsplit

from ._measure import Point

WITHIN = 0.05  # the recommendation: within 5% of the best throughput


def recommend(points: list[Point], within: float = WITHIN) -> tuple[Point, Point] | None:
    """(the recommended point, the best point): the smallest setting (fewest processes, then
    concurrency, then prefetch) whose throughput is within ``within`` of the best."""
    ok = [p for p in points if p.jobs_per_s]
    if not ok:
        return None
    best = max(ok, key=lambda p: p.jobs_per_s or 0.0)
    close = [p for p in ok if (p.jobs_per_s or 0.0) >= (1 - within) * (best.jobs_per_s or 0.0)]
    return min(close, key=lambda p: (p.processes, p.concurrency, p.prefetch)), best


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _table(points: list[Point], chosen: Point | None) -> str:
    head = (
        f"  {'procs':>5} {'conc':>5} {'prefetch':>8} {'jobs/s':>10} {'p50 ms':>8} "
        f"{'p99 ms':>8} {'CPU s/1k':>9} {'ops/job':>8}"
    )
    rows = [head]
    for p in points:
        mark = "*" if p is chosen else " "
        row = (
            f"{mark} {p.processes:>5} {p.concurrency:>5} {p.prefetch:>8} "
            f"{_fmt(p.jobs_per_s, ',.0f'):>10} {_fmt(p.p50_ms, '.2f'):>8} "
            f"{_fmt(p.p99_ms, '.2f'):>8} {_fmt(p.cpu_s_per_1k, '.3f'):>9} "
            f"{_fmt(p.ops_per_job, '.1f'):>8}"
        )
        if p.error:
            row += f"  error: {p.error}"
        elif p.failed:
            row += f"  ({p.failed} jobs failed)"
        rows.append(row)
    return "\n".join(rows)


class Progress:
    """A progress bar on stderr: redrawn in place on a terminal, one line per setting else."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def _bar(self, fraction: float) -> str:
        filled = int(30 * min(max(fraction, 0.0), 1.0))
        return "[" + "#" * filled + "-" * (30 - filled) + "]"

    def tick(self, index: int, point: Point, phase: str, done: int, target: int) -> None:
        now = time.monotonic()
        if not self.tty or now - self.last < 0.1:
            return
        self.last = now
        start, width = {"preload": (0.0, 0.2), "drain": (0.2, 0.5)}.get(phase, (0.7, 0.3))
        part = start + width * done / max(target, 1)
        line = (
            f"{self._bar((index + part) / self.total)} {index + 1}/{self.total} "
            f"{point.label}: {phase} {done}/{target}"
        )
        sys.stderr.write("\r" + line[:150].ljust(150))
        sys.stderr.flush()

    def point_done(self, index: int, point: Point) -> None:
        rate = point.error or f"{_fmt(point.jobs_per_s, ',.0f')} jobs/s"
        bar = self._bar((index + 1) / self.total)
        line = f"{bar} {index + 1}/{self.total} {point.label}: {rate}"
        sys.stderr.write(("\r" + line.ljust(150) if self.tty else line) + "\n")
        sys.stderr.flush()


def redact(url: str) -> str:
    """``url`` with its password shown as ``***``."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return parts._replace(netloc=netloc).geturl()
    return url


def report(cfg: dict[str, Any], points: list[Point], *, as_json: bool) -> None:
    """Print the results to stdout: a table and the recommendation, or JSON."""
    picked = recommend(points)
    chosen, best = picked if picked else (None, None)
    if as_json:
        print(
            json.dumps(
                {
                    "queue": cfg["queue"],
                    "broker": redact(cfg["broker"]),
                    "work": None if cfg["app"] else cfg["work"],
                    "app": cfg["app"],
                    "task": cfg["task"],
                    "jobs": cfg["jobs"],
                    "results": [asdict(p) for p in points],
                    "best": asdict(best) if best else None,
                    "recommendation": asdict(chosen) if chosen else None,
                },
                indent=2,
            )
        )
        return
    what = f"task {cfg['task']}" if cfg["app"] else f"work={cfg['work']}"
    print(
        f"aqw bench: {what}, {cfg['jobs']} jobs per setting, queue {cfg['queue']} "
        f"on {redact(cfg['broker'])}"
    )
    print(_table(points, chosen))
    if chosen is None or best is None:
        print("no setting finished: no recommendation")
        return
    print(
        f"recommended: {chosen.label}  ({chosen.jobs_per_s:,.0f} jobs/s; best "
        f"{best.jobs_per_s:,.0f} jobs/s with {best.label})"
    )
