"""What a new user meets first on the command line, each run as ``python -m aqw``
subprocesses of this tree: validation errors as pydantic's lines, an app named by its file,
unknown options pointing at the right help, copy-paste hints that work when pasted,
missing-extra hints that fit an install from a checkout, ``--watch`` into a pipe, Ctrl-C's
exit status, a duplicate key, and ``cron list`` without a scheduler."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from aqw.errors import EXTRAS, extra_hint
from tests._cli_runs import run_aqw
from tests._helpers import REDIS_URL, free_port

pytestmark = [pytest.mark.timeout(90)]

ROOT = Path(__file__).resolve().parents[1]

APP_SOURCE = """
import os

import aqw

app = aqw.App(os.environ.get("JOBS_BROKER", "memory://hints"), queue="unused-default")


@app.task
async def add(x: int, y: int) -> int:
    return x + y


@app.task
async def refuse(n: int) -> None:
    raise aqw.Reject(f"order {n} was cancelled")


@app.task(schedule=aqw.Every(3600))
async def hourly() -> None:
    pass
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "jobs.py").write_text(APP_SOURCE)
    return tmp_path


def env_of(cwd: Path, **extra: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(ROOT),
        "HOME": str(cwd),
        **extra,
    }


def aqw(
    cwd: Path, *argv: str, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return run_aqw(argv, cwd, env or env_of(cwd), timeout)


def explain(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def one_line(result: subprocess.CompletedProcess[str], status: int) -> str:
    assert result.returncode == status, explain(result)
    assert "Traceback" not in result.stderr, explain(result)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, explain(result)
    return lines[0]


# -- errors -------------------------------------------------------------------------------


def test_a_payload_that_does_not_fit_prints_pydantics_lines(project: Path) -> None:
    result = aqw(project, "enqueue", "jobs:app", "add", '{"x": "a"}')
    assert result.returncode == 2, explain(result)
    lines = result.stderr.splitlines()
    assert lines[0] == (
        "aqw: error: payload does not fit task 'add': 2 validation errors for add_payload"
    ), explain(result)
    assert "\\n" not in result.stderr, "newlines printed as a literal \\n"
    assert lines[1:] == [
        "  x",
        "    Input should be a valid integer, unable to parse string as an integer "
        "[type=int_parsing, input_value='a', input_type=str]",
        "  y",
        "    Field required [type=missing, input_value={'x': 'a'}, input_type=dict]",
    ], explain(result)


def test_no_payload_says_so(project: Path) -> None:
    line = one_line(aqw(project, "enqueue", "jobs:app", "add"), 2)
    assert line.startswith("aqw: error: payload does not fit task 'add': no payload given")


@pytest.mark.parametrize("spec", ["./jobs.py:app", "jobs.py:app", "./jobs:app"])
def test_an_app_named_by_its_file_suggests_its_module(project: Path, spec: str) -> None:
    line = one_line(aqw(project, "worker", spec), 2)
    assert f"app {spec!r} names a file" in line
    assert "as jobs:app" in line


def test_an_unknown_option_points_at_the_subcommands_help(project: Path) -> None:
    line = one_line(aqw(project, "worker", "jobs:app", "--reload"), 2)
    assert line == "aqw worker: error: unrecognized arguments: --reload (see aqw worker --help)"
    line = one_line(aqw(project, "dlq", "list", "--nope"), 2)
    assert line.endswith("(see aqw dlq list --help)")


# -- missing extras ---------------------------------------------------------------------------


def test_the_extras_named_in_hints_are_the_projects() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for extra, packages in EXTRAS.items():
        wanted = {re.split(r"[<>=\[ ]", spec, maxsplit=1)[0] for spec in declared[extra]}
        assert set(packages) == wanted, extra
    assert "uvicorn" in EXTRAS["fastapi"]  # an app served with uvicorn needs it
    hint = extra_hint("sqs")
    assert (
        hint.startswith("pip install aioboto3 (the sqs extra") and "pip install -e '.[sqs]'" in hint
    )
    assert "aqw[" not in hint  # `pip install 'aqw[sqs]'` would not install this project


def without(module: str, *argv: str) -> list[str]:
    """``python -c`` running ``aqw ARGV`` as if ``module`` were not installed."""
    code = (
        f"import sys; sys.modules[{module!r}] = None; "
        "from aqw.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    return [sys.executable, "-c", code, *argv]


def run(cwd: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=env_of(cwd), capture_output=True, text=True, timeout=30
    )


def test_missing_extras_say_how_to_add_them(project: Path) -> None:
    line = one_line(run(project, without("uvloop", "worker", "jobs:app", "--loop", "uvloop")), 2)
    assert "uvloop is not installed; pip install uvloop (the uvloop extra;" in line, line
    line = one_line(run(project, without("starlette", "dashboard", "jobs:app")), 2)
    assert "needs the dashboard extra (no module named 'starlette')" in line, line
    assert "pip install starlette jinja2 uvicorn (the dashboard extra;" in line, line
    line = one_line(run(project, without("aioboto3", "status", "--broker", "sqs://q")), 2)
    assert "the sqs:// broker needs the 'sqs' extra: pip install aioboto3 (the sqs extra;" in line
    assert "aqw[" not in line.replace("'.[sqs]'", ""), line


def test_the_dashboard_without_its_extra_is_a_one_line_import_error(project: Path) -> None:
    code = (
        "import sys; sys.modules['jinja2'] = None\n"
        "try:\n"
        "    from aqw.dashboard import create_app\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc.name, exc, sep='|')\n"
    )
    result = run(project, [sys.executable, "-c", code])
    assert result.returncode == 0, explain(result)
    kind, name, message = result.stdout.strip().split("|")
    assert (kind, name) == ("ImportError", "jinja2"), result.stdout
    assert message.startswith("aqw.dashboard needs the dashboard extra (no module named")
    assert "pip install starlette jinja2 uvicorn" in message and "\n" not in message


def test_dashboard_help_names_purge_among_the_refused_writes(project: Path) -> None:
    result = aqw(project, "dashboard", "--help")
    assert result.returncode == 0, explain(result)
    said = " ".join(result.stdout.split())
    assert re.search(r"--read-only +refuse every write action \([^)]*\bpurge\)", said), said


# -- output into a pipe, Ctrl-C -------------------------------------------------------------


def test_status_watch_into_head_ends_quietly_without_screen_codes(project: Path) -> None:
    command = (
        "set -o pipefail; "
        f"{shlex.quote(sys.executable)} -m aqw status --broker memory://w --watch 0.2 | head -3"
    )
    result = subprocess.run(
        ["bash", "-c", command],
        cwd=project,
        env=env_of(project),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 128 + signal.SIGPIPE, explain(result)
    assert result.stderr == "", explain(result)  # no BrokenPipeError, no "Exception ignored"
    assert "\x1b" not in result.stdout, "clear-screen codes written into a pipe"
    assert result.stdout.startswith("aqw status: queue w"), explain(result)


def interrupted(
    cwd: Path, argv: list[str], ready: str, times: int = 1, **popen: object
) -> tuple[int, str]:
    """Start ``argv``, wait for ``times`` lines with ``ready`` on its stderr, send SIGINT;
    (exit status, stderr)."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env_of(cwd),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        **popen,  # type: ignore[call-overload]
    )
    seen: list[str] = []
    assert proc.stderr is not None
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            if sum(ready in line for line in seen) >= times:
                break
        assert sum(ready in line for line in seen) >= times, "".join(seen)
        if popen.get("start_new_session"):
            os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole group
        else:
            proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        return proc.wait(30), "".join(seen) + rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stderr.close()


def test_ctrl_c_exits_130(project: Path) -> None:
    status, said = interrupted(
        project,
        [sys.executable, "-m", "aqw", "--log-level", "INFO", "worker", "jobs:app"],
        " started on memory://",
    )
    assert status == 130, said
    assert "received SIGINT: stopping gracefully" in said
    assert re.search(r"stopped after \d+\.\ds: 0 succeeded", said), said
    assert "Traceback" not in said


def test_ctrl_c_on_the_dashboard_exits_130(project: Path) -> None:
    pytest.importorskip("uvicorn")
    argv = [sys.executable, "-m", "aqw", "dashboard", "jobs:app", "--port", str(free_port())]
    status, said = interrupted(project, argv, "Application startup complete")
    assert status == 130, said
    assert "Traceback" not in said


@pytest.mark.redis
def test_ctrl_c_on_supervised_workers_stops_them_gracefully_once(project: Path) -> None:
    """A terminal's Ctrl-C goes to the whole foreground group: the workers must get it once
    (from the supervisor), not once more straight from the terminal, which would be the
    second signal that stops at once."""
    argv = [sys.executable, "-m", "aqw", "worker", "jobs:app", "--processes", "2"]
    argv += ["--broker", REDIS_URL, "--queue", f"t-sup-{os.getpid()}"]
    status, said = interrupted(project, argv, " started on ", 2, start_new_session=True)
    assert status == 130, said
    assert said.count("received SIGINT: stopping gracefully") == 2, said
    assert "stopping at once" not in said, said


# -- copy-paste hints, duplicates, cron list ---------------------------------------------------


@pytest.mark.redis
def test_pasted_hints_work(project: Path, queue_name: str) -> None:
    """The commands that the worker's log line, ``aqw job wait`` and ``aqw dlq show``
    suggest run as printed (the queue is not the app's own: the hint must carry it)."""
    env = env_of(project, JOBS_BROKER=REDIS_URL)
    target = ["--app", "jobs:app", "--queue", queue_name]
    enqueued = aqw(project, "enqueue", *target, "refuse", "7", env=env)
    assert enqueued.returncode == 0, explain(enqueued)
    job_id = enqueued.stdout.strip()
    worker = aqw(project, "worker", *target, "--burst", env=env)
    assert worker.returncode == 0, explain(worker)
    [hint] = re.findall(r"\((aqw dlq show [^)]*)\)", worker.stderr)
    assert hint.endswith(f"--app jobs:app --queue {queue_name}"), hint
    shown = aqw(project, *shlex.split(hint)[1:], env=env)
    assert shown.returncode == 0, explain(shown)
    assert f"  job           {job_id}" in shown.stdout
    [replay] = re.findall(r"replay +(aqw dlq replay .*)", shown.stdout)
    waited = aqw(project, "job", "wait", *target, job_id, env=env)
    assert waited.returncode == 3, explain(waited)
    [again] = re.findall(r": (aqw dlq show .*)\)", waited.stdout)
    assert aqw(project, *shlex.split(again)[1:], env=env).returncode == 0
    record = aqw(project, "status", *target, job_id, env=env)
    [from_record] = re.findall(r"\((aqw dlq show .*)\)", record.stdout)
    assert from_record == again
    replayed = aqw(project, *shlex.split(replay)[1:], env=env)
    assert replayed.returncode == 0, explain(replayed)
    assert replayed.stdout.strip() == "1"
    assert "replayed 1 job\n" in replayed.stderr, explain(replayed)


@pytest.mark.redis
def test_a_second_enqueue_of_a_key_says_it_is_a_duplicate(project: Path, queue_name: str) -> None:
    env = env_of(project, JOBS_BROKER=REDIS_URL)
    argv = ["enqueue", "jobs:app", "add", '{"x": 1, "y": 2}', "--key", "k1"]
    first = aqw(project, *argv, "--queue", queue_name, env=env)
    second = aqw(project, *argv, "--queue", queue_name, env=env)
    assert first.returncode == second.returncode == 0, explain(second)
    assert first.stdout == second.stdout and first.stderr == "", explain(first)
    assert second.stderr == (
        "note: a job with key 'k1' was enqueued before: nothing new was enqueued, "
        "this is that job's id\n"
    ), explain(second)


def test_cron_list_without_a_worker_says_no_tick_is_enqueued(project: Path) -> None:
    result = aqw(project, "cron", "list", "jobs:app")
    assert result.returncode == 0, explain(result)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("no worker is running on queue hints, so no scheduler"), lines
    assert "  next tick (once a worker runs): " in result.stdout, result.stdout
