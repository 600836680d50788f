"""``aqw dashboard`` as a user runs it (subprocesses): it refuses to start against a broker
that does not answer, as ``aqw worker`` does, says where it listens and which queue it
shows, refuses an address it cannot bind, and its help names every refused write."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests._helpers import REDIS_URL, free_port


def app_file(tmp_path: Path, url: str, queue: str) -> None:
    (tmp_path / "dash_app.py").write_text(f"import aqw\napp = aqw.App({url!r}, queue={queue!r})\n")


def aqw_dashboard(
    tmp_path: Path, env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aqw", "dashboard", "dash_app:app", *args],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": f"{tmp_path}:{env['PYTHONPATH']}"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_it_refuses_to_start_against_a_broker_that_does_not_answer(
    tmp_path: Path, queue_name: str, subprocess_env: dict[str, str]
) -> None:
    port = free_port()
    app_file(tmp_path, f"redis://:hunter2@127.0.0.1:{port}/0", queue_name)
    done = aqw_dashboard(tmp_path, subprocess_env, "--port", str(free_port()))
    assert done.returncode == 1, done
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(
        f"aqw: error: cannot reach the broker redis://127.0.0.1:{port}/0 queue={queue_name}: "
        "ConnectionError: "
    ), line
    assert "hunter2" not in line and line.count("ConnectionError") == 1


@pytest.mark.redis
def test_it_says_where_it_listens_and_which_queue_it_shows(
    tmp_path: Path, queue_name: str, subprocess_env: dict[str, str]
) -> None:
    app_file(tmp_path, REDIS_URL, queue_name)
    port = free_port()
    env = {**subprocess_env, "PYTHONPATH": f"{tmp_path}:{subprocess_env['PYTHONPATH']}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "aqw", "dashboard", "dash_app:app", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # said before it serves
        assert first == (
            f"aqw dashboard: queue {queue_name!r} of {REDIS_URL} queue={queue_name}, "
            f"listening on http://127.0.0.1:{port}/\n"
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                page = httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        assert page.status_code == 200 and queue_name in page.text
        assert page.headers["x-frame-options"] == "DENY"
    finally:
        proc.terminate()
        proc.wait(15)
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.mark.redis
def test_an_address_it_cannot_bind_is_one_line(
    tmp_path: Path, queue_name: str, subprocess_env: dict[str, str]
) -> None:
    app_file(tmp_path, REDIS_URL, queue_name)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = aqw_dashboard(tmp_path, subprocess_env, "--port", str(port))
    assert done.returncode == 2, done
    [line] = done.stderr.splitlines()
    assert line == f"aqw: error: --host/--port: cannot listen on 127.0.0.1:{port}: " + (
        "Address already in use"
    )


def test_its_help_names_every_write_read_only_refuses(subprocess_env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "aqw", "dashboard", "--help"],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    refused = text.split("refuse every write action (")[1].split(")")[0]
    for action in (
        "cancel",
        "replay",
        "replay with an edited payload",
        "purge",
        "pause",
        "resume",
        "delete a waiting job",
        "run a delayed job now",
    ):
        assert action in refused, action
    assert "refuses to start when the broker does not answer (exit status 1)" in text
