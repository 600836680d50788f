"""The dashboard in a real browser: headless Chromium (Debian's package, driven by Playwright
with ``executable_path``; no browser download) against the FastAPI example app
(``examples/fastapi_app.py``, the dashboard mounted at ``/aqw``) under uvicorn on the real
Redis, with its embedded worker processing jobs.

It watches the counts change as a job starts, opens the running job, cancels it, replays a
dead job with an edited payload from the dead-letter pages, and checks each outcome in
Redis; a payload holding a ``<script>`` tag renders as text and never runs.

Set ``AQW_SCREENSHOTS=docs/img`` to refresh the screenshots that ``docs/dashboard.md`` shows
(otherwise they go to the test's temporary directory). Skipped, with the reason, only when
``/usr/bin/chromium`` is missing (``.ci/run`` installs it)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

import aqw
from aqw._redis.keys import QueueKeys
from tests._helpers import REDIS_URL, free_port

CHROMIUM = Path("/usr/bin/chromium")
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fastapi_app.py"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCRIPT = "<script>window.__xss = 1</script>"

pytestmark = [
    pytest.mark.redis,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="Chromium is not installed at /usr/bin/chromium (apt-get install -y chromium; "
        ".ci/run installs it)",
    ),
]


def wait_for(pred: Callable[[], Any], within: float, what: str) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture
def server(tmp_path: Path, queue_name: str, subprocess_env: dict[str, str]) -> Iterator[str]:
    """The example app under uvicorn on a free loopback port: its base URL."""
    port = free_port()
    env = dict(subprocess_env, AQW_BROKER=REDIS_URL, AQW_QUEUE=queue_name, AQW_CONCURRENCY="4")
    log = tmp_path / "uvicorn.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "fastapi_app:app",
                "--app-dir",
                str(EXAMPLE.parent),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, log.read_text(errors="replace")
        try:
            return httpx.get(base + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, 20, "uvicorn to serve the example app")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


async def _enqueue_bad_report(queue: str) -> str:
    """A make_report job whose payload the worker refuses (seconds < 0, a script tag in its
    name), enqueued by a producer that does not validate: it goes to the DLQ."""
    producer = aqw.App(REDIS_URL, queue=queue)

    @producer.task(name="make_report")
    async def make_report(data: dict[str, Any]) -> None:
        return None

    [job_id] = await producer.enqueue(make_report, [{"name": SCRIPT, "seconds": -1}])
    await producer.close()
    return str(job_id)


def test_the_dashboard_in_chromium(server: str, queue_name: str, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    shots = Path(os.environ.get("AQW_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    keys = QueueKeys(queue_name)
    raw = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    dash = server + "/aqw"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            page.goto(dash + "/")
            assert page.text_content("#count-running") == "0"

            # A job starts: the overview's counts change.
            quick = httpx.post(server + "/jobs", json={"name": "q1", "seconds": 0.2, "steps": 2})
            long = httpx.post(server + "/jobs", json={"name": "big", "seconds": 120, "steps": 60})
            long_id = long.json()["job_id"]
            assert quick.status_code == long.status_code == 202

            def running_shown() -> bool:
                page.reload()
                return page.text_content("#count-running") == "1"

            wait_for(running_shown, 20, "the overview to count the running job")
            wait_for(
                lambda: raw.hget(keys.record(quick.json()["job_id"]), "state") == "succeeded",
                20,
                "the quick job to succeed",
            )

            # The running job, opened from the running page, then cancelled.
            page.goto(dash + "/running")
            page.wait_for_selector(f"text={long_id}")
            wait_for(
                lambda: page.reload() or "step" in (page.text_content("#running") or ""),
                20,
                "the job's progress",
            )
            page.screenshot(path=str(shots / "dashboard-running.png"))
            page.click(f"a:has-text('{long_id}')")
            assert page.text_content("#job-state") == "running"
            page.screenshot(path=str(shots / "dashboard-job.png"))
            page.click("text=Cancel this job")
            page.click("text=Yes, do it")
            assert "cancelling" in (page.text_content("main") or "")
            wait_for(
                lambda: raw.hget(keys.record(long_id), "state") == "cancelled",
                20,
                "the cancelled job's record",
            )

            # A dead job: listed with its payload as text; replayed with an edited payload.
            with ThreadPoolExecutor(1) as pool:  # Playwright's sync API holds this thread's loop
                dead_id = pool.submit(asyncio.run, _enqueue_bad_report(queue_name)).result(20)
            wait_for(lambda: raw.hget(keys.record(dead_id), "state") == "dead", 20, "the dead job")
            page.goto(dash + "/dlq")
            page.click("summary")
            assert SCRIPT in (page.text_content(".payload") or "")
            assert page.evaluate("window.__xss") is None
            page.screenshot(path=str(shots / "dashboard-dlq.png"))
            page.click("text=edit & replay")
            assert SCRIPT in (page.text_content("#payload") or "")
            page.fill("textarea[name=payload]", '{"name": "fixed", "seconds": -5}')
            page.click("text=Validate and replay")
            assert "greater than or equal to 0" in (page.text_content("#payload-error") or "")
            assert raw.xlen(keys.dlq) == 1  # a bad edit replays nothing
            page.fill("textarea[name=payload]", '{"name": "fixed", "seconds": 0.1, "steps": 1}')
            page.click("text=Validate and replay")
            page.click("text=Yes, do it")
            assert "replayed 1 entry" in (page.text_content("main") or "")
            wait_for(
                lambda: raw.hget(keys.record(dead_id), "state") == "succeeded",
                20,
                "the replayed job to succeed",
            )
            result = json.loads(raw.hget(keys.record(dead_id), "result") or "null")
            assert result["name"] == "fixed" and raw.xlen(keys.dlq) == 0

            page.goto(dash + "/")
            assert page.text_content("#count-dead") == "0"
            assert page.evaluate("window.__xss") is None
            page.screenshot(path=str(shots / "dashboard-overview.png"))
            browser.close()
    finally:
        raw.close()
