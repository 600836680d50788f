"""``aqw bench``, run as a subprocess on ``memory://`` and on the real Redis.

It runs as ``python -m aqw.cli.bench ARGS`` (the same parser and code as ``aqw bench ARGS``).
Every run must print a table and a recommendation, and leave no ``aqw:{<bench queue>}:*``
key behind, also when interrupted.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import REDIS_URL, delete_queue_keys

from aqw.cli.bench._main import Point, recommend

pytestmark = pytest.mark.timeout(150)

QUEUE_LINE = re.compile(r"aqw bench: queue (\S+) on ")
ROW = re.compile(r"^[* ] +(\d+) +(\d+) +(\d+) +([\d,]+|-) ")


def bench(
    *args: str, env: dict[str, str], cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aqw.cli.bench", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def bench_queue(result: subprocess.CompletedProcess[str]) -> str:
    match = QUEUE_LINE.search(result.stderr)
    assert match, result.stderr
    return match[1]


def rows(stdout: str) -> list[tuple[int, int, int]]:
    return [
        (int(m[1]), int(m[2]), int(m[3])) for line in stdout.splitlines() if (m := ROW.match(line))
    ]


def queue_keys(queue: str) -> list[bytes]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        return list(client.scan_iter(match=f"aqw:{{{queue}}}:*", count=1000))
    finally:
        client.close()


@pytest.fixture
def env(subprocess_env: dict[str, str]) -> dict[str, str]:
    clean = {k: v for k, v in subprocess_env.items() if not k.startswith("AQW_")}
    return clean


@pytest.fixture
def bench_queues() -> Iterator[list[str]]:
    """Queues the bench used: checked clean by the tests, deleted anyway at the end."""
    made: list[str] = []
    yield made
    delete_queue_keys(made)


def test_recommend_picks_the_smallest_setting_within_5_percent() -> None:
    points = [
        Point(1, 10, 0, jobs_per_s=800.0),
        Point(1, 50, 0, jobs_per_s=960.0),
        Point(1, 50, 50, jobs_per_s=990.0),
        Point(2, 10, 0, jobs_per_s=1000.0),
        Point(2, 50, 0, error="timed out"),
    ]
    picked = recommend(points)
    assert picked is not None
    chosen, best = picked
    assert (best.processes, best.concurrency, best.prefetch) == (2, 10, 0)
    assert (chosen.processes, chosen.concurrency, chosen.prefetch) == (1, 50, 0)
    assert recommend([Point(1, 10, 0, error="x")]) is None


def test_quick_on_memory_prints_a_table_and_a_recommendation(env: dict[str, str]) -> None:
    result = bench("--quick", "--broker", "memory://", "--work", "mix", env=env)
    assert result.returncode == 0, result.stderr
    assert bench_queue(result).startswith("aqw-bench-")
    assert "jobs/s" in result.stdout and "p99 ms" in result.stdout
    assert rows(result.stdout) == [(1, 10, 0), (1, 10, 20), (1, 50, 0), (1, 50, 20)]
    assert re.search(
        r"^recommended: --processes 1 --concurrency \d+ --prefetch \d+", result.stdout, re.M
    )
    assert "4/4" in result.stderr  # the progress bar


def test_json_on_memory(env: dict[str, str]) -> None:
    result = bench("--quick", "--json", "-c", "5,20", "--prefetch", "0", env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["broker"] == "memory://"
    assert [(r["concurrency"], r["prefetch"]) for r in report["results"]] == [(5, 0), (20, 0)]
    for r in report["results"]:
        assert r["jobs_per_s"] > 0 and r["p50_ms"] is not None and r["cpu_s_per_1k"] > 0
        assert r["ops_per_job"] is None  # no Redis, no INFO
        assert r["error"] is None
    best = report["best"]["jobs_per_s"]
    assert report["recommendation"]["jobs_per_s"] >= 0.95 * best


@pytest.mark.xdist_group("processes")  # see CONTRIBUTING.md: one at a time
@pytest.mark.redis
def test_quick_on_redis_with_two_process_counts(
    env: dict[str, str], bench_queues: list[str]
) -> None:
    # one concurrency (the quick grid has two): each row starts its worker processes afresh
    result = bench("--quick", "--broker", REDIS_URL, "--processes", "1,2", "-c", "20", env=env)
    bench_queues.append(bench_queue(result))
    assert result.returncode == 0, result.stderr
    assert [r[0] for r in rows(result.stdout)] == [1, 1, 2, 2]
    assert re.search(r"^recommended: --processes [12] ", result.stdout, re.M), result.stdout
    ops = [line.split()[-1] for line in result.stdout.splitlines() if ROW.match(line)]
    assert all(float(x) > 0 for x in ops), result.stdout  # INFO commandstats on real Redis
    assert queue_keys(bench_queues[0]) == []


@pytest.mark.xdist_group("processes")  # see CONTRIBUTING.md: one at a time
@pytest.mark.redis
def test_json_on_redis_with_a_named_queue(env: dict[str, str], bench_queues: list[str]) -> None:
    queue = f"aqw-bench-t{uuid.uuid4().hex[:8]}"
    bench_queues.append(queue)
    result = bench(
        "--quick",
        "--json",
        "--broker",
        REDIS_URL,
        "--queue",
        queue,
        "-c",
        "20",
        "--prefetch",
        "0,10",
        "--work",
        "sleep",
        "--sleep-ms",
        "2",
        env=env,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["queue"] == queue and report["work"] == "sleep"
    assert len(report["results"]) == 2
    for r in report["results"]:
        assert r["jobs"] > 300 and r["failed"] == 0
        assert r["ops_per_job"] > 0 and r["p99_ms"] >= r["p50_ms"] >= 2.0
    assert queue_keys(queue) == []


@pytest.mark.redis
def test_a_named_queue_in_use_is_refused(env: dict[str, str], bench_queues: list[str]) -> None:
    queue = f"aqw-bench-t{uuid.uuid4().hex[:8]}"
    bench_queues.append(queue)
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.set(f"aqw:{{{queue}}}:fence", 7)
        result = bench("--quick", "--broker", REDIS_URL, "--queue", queue, env=env)
        assert result.returncode == 2
        assert "has keys already" in result.stderr
        assert client.get(f"aqw:{{{queue}}}:fence") == b"7"
    finally:
        client.close()


def processes_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text.encode() in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            pass
    return pids


@pytest.mark.redis
def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_run_cleans_up(
    env: dict[str, str], bench_queues: list[str], sig: signal.Signals
) -> None:
    queue = f"aqw-bench-t{uuid.uuid4().hex[:8]}"
    bench_queues.append(queue)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aqw.cli.bench",
            "--broker",
            REDIS_URL,
            "--queue",
            queue,
            # 2,000 jobs of 50 ms at 2 x 10: a drain of about 5 s, so the signal lands in
            # the workers' start or their drain (200,000 no-op jobs did too, but left as
            # many record keys on the shared Redis, which every other test's SCAN crawled)
            "--jobs",
            "2000",
            "--work",
            "sleep",
            "--sleep-ms",
            "50",
            "--processes",
            "2",
            "-c",
            "10",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A run started in the background (`.ci/run &`) hands its children SIGINT ignored,
        # and the bench then leaves SIGINT alone, as a background job should: the bench
        # under test is a foreground one.
        preexec_fn=_default_sigint,
    )
    try:
        deadline = time.monotonic() + 30
        while not queue_keys(queue):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1.0)  # preloading or draining
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + sig, err
    assert "cleaning up" in err
    assert queue_keys(queue) == []
    assert processes_mentioning(queue) == [], "a bench worker process outlived the bench"


def test_a_task_of_the_users_app(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "myjobs.py").write_text(
        textwrap.dedent("""
        import aqw
        from pydantic import BaseModel

        app = aqw.App("memory://", queue="mine")

        class Order(BaseModel):
            order_id: int

        @app.task
        async def ship(order: Order) -> None:
            assert order.order_id == 7
            print("shipped", order.order_id)  # stdout of a task must not confuse the bench

        @app.task
        async def other() -> None: ...
    """)
    )
    common = ["--quick", "--json", "--app", "myjobs:app", "-c", "10", "--prefetch", "0"]
    result = bench(*common, "--task", "ship", "--payload", '{"order_id": 7}', env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    assert report["task"] == "ship" and report["work"] is None
    assert report["results"][0]["failed"] == 0 and report["recommendation"] is not None

    bad = bench(*common, "--task", "ship", "--payload", '{"order_id": "x"}', env=env, cwd=tmp_path)
    assert bad.returncode == 2 and "does not fit task 'ship'" in bad.stderr
    unnamed = bench(*common, env=env, cwd=tmp_path)
    assert unnamed.returncode == 2 and "--task other|ship" in unnamed.stderr


RESULTS_BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "results_bench.py"


@pytest.mark.redis
def test_results_benchmark_tiny_run(env: dict[str, str], tmp_path: Path) -> None:
    """``benchmarks/results_bench.py`` end to end, tiny: both drains, both latency trials,
    the JSON report, and nothing left behind (no keys, no child process). No timing is
    checked: the machine is shared."""
    out = tmp_path / "results.json"
    args = ["--jobs", "200", "--repeat", "1", "--rate", "50", "--seconds", "1"]
    args += ["--url", REDIS_URL, "--trial-timeout", "30", "--json", str(out)]
    result = subprocess.run(
        [sys.executable, str(RESULTS_BENCH), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert result.returncode == 0, result.stderr
    assert "on / off:" in result.stdout and "raw RPUSH/BLPOP baseline" in result.stdout
    report = json.loads(out.read_text())
    for label in ("off", "on"):
        assert report["drain"][label]["jobs_per_s"] > 0
    for kind in ("aqw", "raw"):
        lat = report["latency"][kind]
        assert lat["count"] == 50 and lat["errors"] == {}
        assert lat["trials"][0]["worker_processed"] >= 50
    queues = report["queues"]
    assert len(queues) == 4
    client = redis.Redis.from_url(REDIS_URL)
    try:
        for queue in queues:
            for pattern in (f"aqw:{{{queue}}}:*", f"rbench:{queue}:*"):
                assert list(client.scan_iter(match=pattern, count=1000)) == []
    finally:
        client.close()
    for queue in queues:
        assert processes_mentioning(queue) == [], "a child process outlived the benchmark"
