"""``benchmarks/cost_budget.py``: the per-job cost CI checks. A tiny run on its own private
redis-server passes the repo's budget and prints every figure; a budget below what a plain
job costs fails it, naming the figure. Counts only, no timing: the machine is shared."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "cost_budget.py"

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]


def run(subprocess_env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--jobs", "300", *args],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=100,
    )


def per_command(line: str) -> dict[str, float]:
    """``"del 0.01, xack 1"`` as {"del": 0.01, "xack": 1.0}."""
    counts: dict[str, float] = {}
    for item in line.split(","):
        name, count = item.strip().rsplit(" ", 1)
        counts[name] = float(count)
    return counts


def test_a_plain_job_is_within_the_budget_and_a_tighter_one_fails(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    ok = run(subprocess_env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    for step in ("enqueue:", "enqueue_many:", "drain:", "drain_logged:"):
        assert step in ok.stdout
    assert "within budget" in ok.stdout
    # a plain job's drain: its start and its ack read its record once each (HMGET); the
    # settle's XACK and XPENDING are one each per merged call (ack.lua), and the stale-start
    # check's XPENDING only for the few jobs a loaded machine let a lease lapse on (a
    # reclaimed record is not a fresh one): none of them once per job
    drain = per_command(ok.stdout.split("drain:")[1].splitlines()[1])
    assert drain["hmget"] == pytest.approx(2, abs=0.05), drain
    assert drain["xack"] < 0.1, drain
    assert drain.get("xpending", 0.0) < 0.1, drain

    tight = tmp_path / "budget.toml"
    tight.write_text("margin = 0.03\n[drain]\ncommands = 2\n[enqueue]\ncommands = 4\n")
    over = run(subprocess_env, "--jobs", "100", "--budget", str(tight))  # fewer: a count
    assert over.returncode == 1
    [line] = [x for x in over.stdout.splitlines() if "OVER BUDGET" in x]
    assert line.startswith("cost_budget: OVER BUDGET drain.commands: ") and "budget 2" in line
