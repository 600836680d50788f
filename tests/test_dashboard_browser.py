"""The dashboard in a real browser: headless Chromium (Debian's package, driven by Playwright
with ``executable_path``; no browser download) against the FastAPI example app
(``examples/fastapi_app.py``, the dashboard mounted at ``/aqw``) under uvicorn on the real
Redis, with its embedded worker processing jobs.

It watches the counts change as a job starts, opens the running job, cancels it, replays a
dead job with an edited payload from the dead-letter pages, and checks each outcome in
Redis; a payload holding a ``<script>`` tag renders as text and never runs; no page breaks
the Content-Security-Policy, and a running job's row is one line high.

A second test serves ``aqw dashboard`` on a private redis-server: the delayed page shows
real due times; when the server stops, the page (reloaded by its own script) is the
broker-down page naming the broker, and when it starts again the normal page comes back
by itself.

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


#: Run before any page script: collects the Content-Security-Policy violations of the page.
WATCH_CSP = (
    "window.__csp = [];"
    "document.addEventListener('securitypolicyviolation',"
    " e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));"
)
#: The height of each row of a table, in lines of the body's text.
ROW_LINES = """sel => {
  const line = parseFloat(getComputedStyle(document.body).lineHeight);
  return [...document.querySelectorAll(sel + ' tbody tr')]
    .map(r => r.getBoundingClientRect().height / line);
}"""


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
            page.add_init_script(WATCH_CSP)
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
            [lines] = page.evaluate(ROW_LINES, "#running")
            assert lines < 1.9, f"a running job's row is {lines:.1f} lines high"
            assert page.evaluate("window.__csp") == []
            page.click(f"a:has-text('{long_id}')")
            assert page.text_content("#job-state") == "running"
            assert page.evaluate("window.__csp") == []
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
            assert page.evaluate("window.__csp") == []
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
            assert page.evaluate("window.__csp") == []
            page.screenshot(path=str(shots / "dashboard-overview.png"))
            browser.close()
    finally:
        raw.close()


def _serve_dashboard(tmp_path: Path, url: str, queue: str, env: dict[str, str]) -> tuple[Any, str]:
    """``aqw dashboard`` of ``queue`` on ``url`` in a subprocess: the process and its base URL,
    once it says where it listens."""
    (tmp_path / "dash_app.py").write_text(f"import aqw\napp = aqw.App({url!r}, queue={queue!r})\n")
    port = free_port()
    log = (tmp_path / "dashboard.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "aqw", "dashboard", "dash_app:app", "--port", str(port)],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": f"{tmp_path}:{env['PYTHONPATH']}"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, (tmp_path / "dashboard.log").read_text(errors="replace")
        try:
            return httpx.get(base + "/", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, 20, "aqw dashboard to serve")
    return proc, base


def _heading(page: Any) -> str:
    """The page's ``h1``, or "" while it is being reloaded."""
    from playwright.sync_api import Error

    try:
        return page.text_content("h1", timeout=1000) or ""
    except Error:
        return ""


async def _enqueue_later(url: str, queue: str) -> list[float]:
    """Three jobs due in about 15 minutes, 3 hours and 2 days: their due times."""
    producer = aqw.App(url, queue=queue)

    @producer.task(name="later")
    async def later(n: int) -> None:
        return None

    dues = []
    for n, delay in enumerate((900, 3 * 3600, 2 * 86400)):
        dues.append(time.time() + delay)
        await later.enqueue(n, delay=delay)
    await producer.close()
    return dues


def test_delayed_times_and_the_broker_down_page_in_chromium(
    private_redis: Any, queue_name: str, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    from playwright.sync_api import sync_playwright

    asyncio.run(_enqueue_later(private_redis.url, queue_name))
    proc, base = _serve_dashboard(tmp_path, private_redis.url, queue_name, subprocess_env)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            page.add_init_script(WATCH_CSP)
            page.goto(base + "/delayed")
            dues = [t.strip() for t in page.locator("#delayed time").all_text_contents()]
            assert len(dues) == 3 and not any("?" in d for d in dues), dues
            for due, soon, later in zip(
                dues,
                ("in 14m", "in 2h 59m", "in 1d 23h"),
                ("in 15m", "in 3h 0m", "in 2d 0h"),
                strict=True,
            ):
                assert soon in due or later in due, dues
            assert all(lines < 1.9 for lines in page.evaluate(ROW_LINES, "#delayed"))
            page.screenshot(path=str(tmp_path / "delayed.png"))

            private_redis.kill()  # its port closed: the broker is down
            response = page.reload()
            assert response is not None and response.status == 503
            assert page.text_content("h1") == "Broker unreachable"
            assert page.text_content("#broker") == f"{private_redis.url} queue={queue_name}"
            assert "ConnectionError" in (page.text_content("#broker-error") or "")
            page.screenshot(path=str(tmp_path / "down.png"))

            private_redis.start()  # the same port again: the page comes back by itself
            wait_for(
                lambda: _heading(page).startswith("Delayed"),
                30,
                "the broker-down page to reload itself into the delayed page",
            )
            assert page.evaluate("window.__csp") == []
            browser.close()
    finally:
        proc.terminate()
        proc.wait(15)
    log = (tmp_path / "dashboard.log").read_text(errors="replace")
    assert log.count("cannot reach the broker") == 1 and log.count("answers again after") == 1, log
