"""The dashboard's queue controls in a real browser (headless Chromium through Playwright,
as ``test_dashboard_browser.py``): ``aqw dashboard`` and an ``aqw worker`` process on the
real Redis. Forty running jobs fit one screen (a row is one line: their dates do not
wrap); the overview's Pause button pauses the queue (a job enqueued then stays queued while
the worker says it stopped fetching) and Resume lets it run; a delayed job's "Run now" runs
it long before its due time; the waiting list shows a job of a paused queue; the rates page
counts the jobs that ran. Set ``AQW_SCREENSHOTS=docs/img`` to refresh the screenshots of
``docs/operations/dashboard-controls.md``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

import aqw
from aqw._redis.keys import QueueKeys
from tests._helpers import REDIS_URL
from tests.test_dashboard_browser import ARGS, CHROMIUM, WATCH_CSP, _serve_dashboard, wait_for

pytestmark = [
    pytest.mark.redis,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Chromium is not installed"),
]

RUNNING = 40

WORKER_APP = """
import asyncio
import aqw

app = aqw.App({url!r}, queue={queue!r})


@app.task(name="hold", lease_ttl=30.0)
async def hold(n: int) -> None:
    await asyncio.sleep(120)


@app.task(name="note")
async def note(n: int) -> None:
    return None
"""


async def _enqueue(queue: str, task: str, n: int, delay: float | None = None) -> list[str]:
    producer = aqw.App(REDIS_URL, queue=queue)

    @producer.task(name=task)
    async def job(n: int) -> None:
        return None

    ids = [str(await job.enqueue(i, delay=delay)) for i in range(n)]
    await producer.close()
    return ids


def test_pause_resume_and_run_now_in_chromium(
    tmp_path: Path, queue_name: str, subprocess_env: dict[str, str]
) -> None:
    from playwright.sync_api import sync_playwright

    shots = Path(os.environ.get("AQW_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)

    (tmp_path / "worker_app.py").write_text(WORKER_APP.format(url=REDIS_URL, queue=queue_name))
    keys = QueueKeys(queue_name)
    raw = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    pool = ThreadPoolExecutor(1)  # Playwright's sync API holds this thread's loop

    def enqueue(task: str, n: int, delay: float | None = None) -> list[str]:
        return pool.submit(asyncio.run, _enqueue(queue_name, task, n, delay)).result(20)

    def state(job_id: str) -> str | None:
        return raw.hget(keys.record(job_id), "state")

    dash, base = _serve_dashboard(tmp_path, REDIS_URL, queue_name, subprocess_env)
    log = tmp_path / "worker.log"
    env = {**subprocess_env, "PYTHONPATH": f"{tmp_path}:{subprocess_env['PYTHONPATH']}"}
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "aqw", "worker", "worker_app:app", "-c", "60", "--grace", "0"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        enqueue("hold", RUNNING)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.add_init_script(WATCH_CSP)

            # Forty running jobs: more than 11 rows fit the screen.
            def all_running() -> bool:
                page.goto(base + "/running")
                return page.locator("#running tbody tr").count() == RUNNING

            wait_for(all_running, 30, f"{RUNNING} running jobs")
            seen = page.evaluate(
                "h => [...document.querySelectorAll('#running tbody tr')]"
                ".filter(r => r.getBoundingClientRect().bottom <= h).length",
                900,
            )
            assert seen > 11, f"only {seen} running jobs fit a 1280x900 screen"

            # Pause from the overview: a new job stays queued while the worker says so.
            page.goto(base + "/")
            page.click("#pause")
            page.click("text=Yes, do it")
            assert "paused" in (page.text_content("main") or "")
            assert raw.exists(f"{keys.tag}:paused")
            wait_for(lambda: "is paused" in log.read_text(errors="replace"), 20, "the pause")
            [queued] = enqueue("note", 1)
            page.goto(base + "/waiting")
            assert queued in (page.text_content("main") or ""), page.text_content("main")
            assert page.text_content("#paused-tag") == "queue paused"
            page.screenshot(path=str(shots / "dashboard-waiting.png"))
            assert state(queued) == "queued"
            page.goto(base + "/")
            assert "paused" in (page.text_content("#queue-state") or "")
            page.click("#resume")
            page.click("text=Yes, do it")
            wait_for(lambda: state(queued) == "succeeded", 20, "the job to run after resume")
            assert not raw.exists(f"{keys.tag}:paused")

            # Run a delayed job now.
            [later] = enqueue("note", 1, delay=3600)
            page.goto(base + "/delayed")
            page.click("#delayed button:has-text('Run now')")
            page.click("text=Yes, do it")
            assert "due now" in (page.text_content("main") or "")
            wait_for(lambda: state(later) == "succeeded", 20, "the promoted job to run")

            # The rates: the jobs that ran, per task, once the worker's heartbeat added them.
            def rates_shown() -> bool:
                page.goto(base + "/rates?range=1h")
                return "<td>note</td>" in page.content()

            wait_for(rates_shown, 30, "the rates page to count the note jobs")
            page.screenshot(path=str(shots / "dashboard-rates.png"))
            assert page.evaluate("window.__csp") == []
            browser.close()
    finally:
        pool.shutdown()
        raw.close()
        for proc in (worker, dash):
            proc.terminate()
        for proc in (worker, dash):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
