"""Live progress on the running page in a real browser (headless Chromium through
Playwright, as ``test_dashboard_browser.py``): ``aqw dashboard`` and an ``aqw worker``
process on the real Redis; the page is loaded once, its auto-refresh off, and the job's bar,
percentage and message follow the job's ``ctx.progress`` reports (server-sent events,
``aqw/dashboard/_live.py``) with no reload, until the row is marked ended; no CSP violation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests._helpers import REDIS_URL
from tests.test_dashboard_browser import ARGS, CHROMIUM, WATCH_CSP, _serve_dashboard, wait_for

pytestmark = [
    pytest.mark.redis,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Chromium is not installed"),
]

#: The job reports step N once the test sets the gate key to N (or more).
WORKER_APP = """
import asyncio
import aqw

app = aqw.App({url!r}, queue={queue!r})


@app.task(name="steps", lease_ttl=30.0)
async def steps(gate: str, ctx: aqw.Context) -> None:
    client = app.broker.client
    for step in range(1, 4):
        while int(await client.get(gate) or 0) < step:
            await asyncio.sleep(0.05)
        await ctx.progress(step / 4, f"step {{step}} of 4")
"""

#: No reload while the test watches: only the event stream can move the bar.
NO_REFRESH = "window.localStorage.setItem('aqw-auto-refresh', 'off');"


def test_the_bar_follows_the_job_without_a_reload(
    tmp_path: Path, queue_name: str, subprocess_env: dict[str, str]
) -> None:
    from playwright.sync_api import sync_playwright

    (tmp_path / "worker_app.py").write_text(WORKER_APP.format(url=REDIS_URL, queue=queue_name))
    raw = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    gate = f"{queue_name}:test-gate"
    dash, base = _serve_dashboard(tmp_path, REDIS_URL, queue_name, subprocess_env)
    env = {**subprocess_env, "PYTHONPATH": f"{tmp_path}:{subprocess_env['PYTHONPATH']}"}
    enqueue = (
        "import asyncio, worker_app\n"
        "async def main():\n"
        f"    print(await worker_app.steps.enqueue({gate!r}))\n"
        "    await worker_app.app.close()\n"
        "asyncio.run(main())\n"
    )
    job_id = (
        subprocess.run(
            [sys.executable, "-c", enqueue], cwd=tmp_path, env=env, check=True, capture_output=True
        )
        .stdout.decode()
        .strip()
    )
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "aqw", "worker", "worker_app:app", "--grace", "0"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.add_init_script(WATCH_CSP + NO_REFRESH)
            row = f"#running tr[data-job='{job_id}']"

            def listed() -> bool:
                page.goto(base + "/running")
                return page.locator(row).count() == 1

            wait_for(listed, 30, "the job on the running page")
            page.evaluate("window.__marker = 'same page'")  # a reload would forget it
            for step in (1, 2, 3):
                raw.set(gate, step)
                wait_for(
                    lambda s=step: page.text_content(f"{row} .pct") == f"{s * 25}%",
                    20,
                    f"step {step} on the bar",
                )
                assert page.text_content(f"{row} .msg") == f"step {step} of 4"
                assert page.eval_on_selector(f"{row} progress", "e => e.value") == step / 4
            wait_for(lambda: page.get_attribute(row, "data-state") == "succeeded", 20, "its end")
            assert page.evaluate("window.__marker") == "same page"  # never reloaded
            assert page.evaluate("window.__csp") == []
            browser.close()
    finally:
        raw.delete(gate)
        raw.close()
        for proc in (worker, dash):
            proc.terminate()
        for proc in (worker, dash):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
