"""The ``aqw`` command line as a person meets it, run as ``python -m aqw`` processes (forked
by ``tests/_cli_runs.py``, each with its own environment, directory and exit status):
``--version``, the log options before or after the subcommand, an explicit 0 being a value
(refused where it makes no sense, never silently the default), one way to name the app
(``APP``, ``--app``, ``AQW_APP``), and SQS set-up mistakes (no region, no or refused
credentials, an endpoint nobody listens on) as one line with exit status 2 or 1.

Every failure is checked to be one line on stderr, without a traceback."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from aqw._version import __version__
from aqw.cli._main import build_parser
from tests._cli_runs import run_aqw
from tests._helpers import free_port

APP_SOURCE = """
import aqw

app = aqw.App("memory://cli")


@app.task
async def hello(name: str) -> None:
    print("hello", name)


@app.task
async def bye() -> None:
    pass
"""

SQS_APP_SOURCE = """
import aqw

app = aqw.App("sqs://cli-test?create=1&wait=1")


@app.task
async def hello(name: str) -> None:
    pass
"""

#: Only what Python needs: no AWS_*, no AQW_* of the environment the tests run in.
BASE_ENV = {
    "PATH": os.environ.get("PATH", ""),
    "PYTHONPATH": str(Path(__file__).resolve().parents[1]),  # this tree's aqw, not another
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
REGION = {"AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A directory with ``jobs.py`` (a memory:// app) and ``sqsjobs.py`` (an sqs:// one)."""
    (tmp_path / "jobs.py").write_text(APP_SOURCE)
    (tmp_path / "sqsjobs.py").write_text(SQS_APP_SOURCE)
    return tmp_path


def aqw(
    cwd: Path, *argv: str, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return run_aqw(argv, cwd, {**BASE_ENV, "HOME": str(cwd), **(env or {})}, timeout)


def explain(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def one_line_error(result: subprocess.CompletedProcess[str], status: int) -> str:
    """The error line of a command that failed with ``status`` and wrote exactly one line."""
    assert result.returncode == status, explain(result)
    assert "Traceback" not in result.stderr, explain(result)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, explain(result)
    assert lines[0].startswith("aqw") and ": error: " in lines[0], explain(result)
    return lines[0]


# -- --version, the log options ---------------------------------------------------------------


def test_version(project: Path) -> None:
    result = aqw(project, "--version")
    assert result.returncode == 0, explain(result)
    assert result.stdout == f"aqw {__version__}\n"


@pytest.mark.parametrize("where", ["before", "after"])
def test_log_level_before_or_after_the_subcommand(project: Path, where: str) -> None:
    status = ["status", "--broker", "memory://q"]
    level = ["--log-level", "DEBUG"]
    result = aqw(project, *(level + status if where == "before" else status + level))
    assert result.returncode == 0, explain(result)
    assert " DEBUG " in result.stderr, explain(result)  # asyncio's "Using selector"


def test_an_option_after_the_subcommand_wins_and_leaving_it_out_keeps_the_first(
    project: Path,
) -> None:
    quiet = aqw(
        project, "--log-level", "DEBUG", "status", "--broker", "memory://q", "--log-level", "ERROR"
    )
    assert quiet.returncode == 0 and "DEBUG" not in quiet.stderr, explain(quiet)
    # the status parser's own --log-level (not given) must not reset the one before it
    loud = aqw(project, "--log-level", "DEBUG", "status", "--broker", "memory://q")
    assert "DEBUG" in loud.stderr, explain(loud)


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["--log-format", "json", "--log-level", "DEBUG", "status", "--broker", "memory://q"], {}),
        (["status", "--broker", "memory://q", "--log-format", "json", "--log-level", "DEBUG"], {}),
        (
            ["status", "--broker", "memory://q"],
            {"AQW_LOG_FORMAT": "json", "AQW_LOG_LEVEL": "DEBUG"},
        ),
    ],
    ids=["before", "after", "env"],
)
def test_log_format_json(project: Path, argv: list[str], env: dict[str, str]) -> None:
    result = aqw(project, *argv, env=env)
    assert result.returncode == 0, explain(result)
    records = [json.loads(line) for line in result.stderr.splitlines()]
    assert records and all(r["level"] == "DEBUG" for r in records), explain(result)


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--log-level", "LOUD", "status", "--broker", "memory://"], {}, "--log-level"),
        (["status", "--broker", "memory://", "--log-level", "LOUD"], {}, "--log-level"),
        (["status", "--broker", "memory://"], {"AQW_LOG_LEVEL": "LOUD"}, "AQW_LOG_LEVEL"),
        (["status", "--broker", "memory://", "--log-format", "xml"], {}, "--log-format"),
        (["status", "--broker", "memory://"], {"AQW_LOG_FORMAT": "xml"}, "AQW_LOG_FORMAT"),
    ],
    ids=["level-before", "level-after", "level-env", "format", "format-env"],
)
def test_a_bad_log_setting_is_one_line(
    project: Path, argv: list[str], env: dict[str, str], named: str
) -> None:
    line = one_line_error(aqw(project, *argv, env=env), 2)
    assert named in line


# -- an explicit 0 is a value -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["worker", "jobs:app", "--concurrency", "0"], {}, "--concurrency"),
        (["worker", "jobs:app", "-c", "0"], {}, "--concurrency"),
        (["worker", "jobs:app", "--processes", "0"], {}, "--processes"),
        (["worker", "jobs:app", "--prefetch", "-1"], {}, "--prefetch"),
        (["worker", "jobs:app", "--grace", "-1"], {}, "--grace"),
        (["worker", "jobs:app", "--burst"], {"AQW_CONCURRENCY": "0"}, "AQW_CONCURRENCY"),
        (["worker", "jobs:app", "--burst"], {"AQW_PROCESSES": "0"}, "AQW_PROCESSES"),
        (["worker", "jobs:app", "--burst"], {"AQW_PREFETCH": "-1"}, "AQW_PREFETCH"),
        (["worker", "jobs:app", "--burst"], {"AQW_GRACE": "soon"}, "AQW_GRACE"),
        (["enqueue", "jobs:app", "bye", "--delay", "-1"], {}, "--delay"),
        (["enqueue", "jobs:app", "bye", "--priority", "-1"], {}, "--priority"),
        (["worker", "jobs:app", "--priority-share", "-0.1"], {}, "--priority-share"),
        (["worker", "jobs:app", "--burst"], {"AQW_PRIORITY_SHARE": "x"}, "AQW_PRIORITY_SHARE"),
        (["status", "--broker", "memory://", "--watch", "0"], {}, "--watch"),
        (["monitor", "--broker", "memory://", "--interval", "0"], {}, "--interval"),
        (["dlq", "list", "--broker", "memory://", "--limit", "0"], {}, "--limit"),
        (["dlq", "purge", "--broker", "memory://", "--older-than", "-1"], {}, "--older-than"),
        (["job", "wait", "jobs:app", "abc", "--timeout", "0"], {}, "--timeout"),
        (["job", "wait", "--broker", "memory://", "abc", "--timeout", "-1"], {}, "--timeout"),
        (["bench", "--jobs", "0"], {}, "--jobs"),
        (["bench", "--timeout", "0"], {}, "--timeout"),
        (["bench", "--latency-seconds", "0"], {}, "--latency-seconds"),
        (["bench", "--concurrency", "0"], {}, "--concurrency"),
    ],
    ids=lambda v: (
        "_".join(v) if isinstance(v, list) else (",".join(v) if isinstance(v, dict) else None)
    ),
)
def test_a_number_out_of_range_is_refused(
    project: Path, argv: list[str], env: dict[str, str], named: str
) -> None:
    line = one_line_error(aqw(project, *argv, env=env), 2)
    assert named in line


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["--prefetch", "0", "--grace", "0"], {}),
        ([], {"AQW_PREFETCH": "0", "AQW_GRACE": "0"}),
    ],
    ids=["options", "env"],
)
def test_prefetch_and_grace_0_are_values(
    project: Path, argv: list[str], env: dict[str, str]
) -> None:
    result = aqw(project, "worker", "jobs:app", "--burst", *argv, env=env)
    assert result.returncode == 0, explain(result)
    assert "stopped after" in result.stderr and " 0 succeeded" in result.stderr


# -- one way to name the app --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["enqueue", "jobs:app", "hello", '"ada"'], {}),
        (["enqueue", "--app", "jobs:app", "hello", '"ada"'], {}),
        (["enqueue", "hello", '"ada"', "--app", "jobs:app"], {}),
        (["enqueue", "hello", '"ada"'], {"AQW_APP": "jobs:app"}),
        (["enqueue", "bye"], {"AQW_APP": "jobs:app"}),
        (["enqueue", "jobs:app", "bye"], {}),
        (["enqueue", "jobs:app", "bye"], {"AQW_APP": "elsewhere:app"}),  # the argument wins
    ],
    ids=["positional", "option", "option-last", "env", "env-no-payload", "no-payload", "both"],
)
def test_enqueue_names_the_app_any_way(project: Path, argv: list[str], env: dict[str, str]) -> None:
    result = aqw(project, *argv, env=env)
    assert result.returncode == 0, explain(result)
    assert len(result.stdout.strip()) == 32, explain(result)  # the job id


@pytest.mark.parametrize(
    ("argv", "env", "said"),
    [
        (["enqueue", "jobs:app", "nope"], {}, "unknown task 'nope' (registered: bye, hello)"),
        (["enqueue", "jobs:app", "bye", "--priority", "10"], {}, "priority"),
        (["worker", "jobs:app", "--burst", "--priority-share", "2"], {}, "priority_share"),
        (["enqueue", "nope", "{}"], {"AQW_APP": "jobs:app"}, "registered: bye, hello"),
        (["enqueue", "jobs:app"], {}, "name the task"),
        (["enqueue", "--app", "jobs:app", "other:app", "bye"], {}, "named twice"),
        (["enqueue", "jobs", "bye", "{}"], {}, "must look like 'package.module:app'"),
        (["enqueue", "bye"], {}, "name the app"),
        (["worker", "--burst"], {}, "name the app"),
        (["worker", "nosuchmodule:app"], {}, "cannot import module 'nosuchmodule'"),
        (["worker", "jobs:app", "--app", "jobs:other"], {}, "named twice"),
        (["status"], {}, "name an app"),
        (["dlq", "show", "jobs:app", "1-0"], {}, "no dead job with id '1-0'"),
        (["dlq", "replay", "jobs:app", "1-0"], {}, "no dead job with id '1-0'"),
        (["dlq", "show", "jobs:app", "abc"], {}, "no dead job with id 'abc': no entry"),
        (["job", "show", "jobs:app"], {}, "name the job: JOB_ID after the app"),
        (["job", "wait"], {}, "the following arguments are required: JOB_ID"),
        (["dlq", "show", "jobs:app"], {}, "name the dead job"),
        (["job", "show", "--app", "jobs:app", "other:app", "abc"], {}, "named twice"),
        (["job", "show", "abc"], {}, "name an app"),
        (["job", "show", "jobs:app", "x" * 201], {}, "job id must be a non-empty string"),
        (["job", "explain", "jobs:app", "abc"], {}, "invalid choice: 'explain'"),
    ],
)
def test_naming_mistakes_are_one_line(
    project: Path, argv: list[str], env: dict[str, str], said: str
) -> None:
    line = one_line_error(aqw(project, *argv, env=env), 2)
    assert said in line


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["status", "jobs:app", "--json"], {}),
        (["status", "--app", "jobs:app", "--json"], {}),
        (["status", "--json"], {"AQW_APP": "jobs:app"}),
    ],
    ids=["positional", "option", "env"],
)
def test_status_names_the_app_any_way(project: Path, argv: list[str], env: dict[str, str]) -> None:
    result = aqw(project, *argv, env=env)
    assert result.returncode == 0, explain(result)
    assert json.loads(result.stdout)["queue"] == "cli"


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["status", "jobs:app", "abc123", "--json"], {}),
        (["status", "abc123", "--app", "jobs:app", "--json"], {}),
        (["status", "abc123", "--json"], {"AQW_APP": "jobs:app"}),
    ],
    ids=["positional", "option", "env"],
)
def test_status_of_a_job(project: Path, argv: list[str], env: dict[str, str]) -> None:
    # the memory:// app of a new process holds no job: no record of it, exit status 6
    line = one_line_error(aqw(project, *argv, env=env), 6)
    assert (
        line == "aqw: error: no record of job 'abc123' on queue 'cli' (never enqueued, or expired)"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["job", "show", "jobs:app", "abc123"],
        ["job", "show", "abc123", "--app", "jobs:app", "--json"],
        ["job", "wait", "jobs:app", "abc123", "--timeout", "1"],
        ["job", "cancel", "abc123", "--broker", "memory://cli"],
    ],
    ids=["show", "show-json", "wait", "cancel"],
)
def test_job_commands_of_an_unknown_job_exit_6(project: Path, argv: list[str]) -> None:
    result = aqw(project, *argv)
    line = one_line_error(result, 6)
    assert line.startswith("aqw: error: no record of job 'abc123'"), line
    assert result.stdout == ""


@pytest.mark.parametrize(
    "argv",
    [
        ["dlq", "list", "jobs:app"],
        ["dlq", "list", "--app", "jobs:app"],
        ["dlq", "purge", "jobs:app", "--all"],
    ],
)
def test_dlq_names_the_app_any_way(project: Path, argv: list[str]) -> None:
    result = aqw(project, *argv)
    assert result.returncode == 0, explain(result)


def _parsers(
    parser: argparse.ArgumentParser, name: str = "aqw"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, child in action.choices.items():
                yield from _parsers(child, f"{name} {sub}")


def test_every_option_has_help() -> None:
    found = dict(_parsers(build_parser()))
    assert {"aqw worker", "aqw bench", "aqw dlq list", "aqw dlq purge"} <= set(found)
    assert {"aqw job", "aqw job show", "aqw job wait", "aqw job cancel"} <= set(found)
    for name, parser in found.items():
        flags = {o for a in parser._actions for o in a.option_strings}
        assert {"--log-level", "--log-format"} <= flags, name
        bare = [
            a.option_strings or a.dest
            for a in parser._actions
            if not a.help and not isinstance(a, argparse._SubParsersAction)
        ]
        assert not bare, f"{name}: no help for {bare}"


# -- SQS set-up mistakes ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def strict_moto() -> Iterator[str]:
    """A moto server that checks credentials (it knows none, so it refuses every key)."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.1)
        yield endpoint
    finally:
        server.terminate()
        server.wait(10)


COMMANDS = {
    "worker": ["worker", "sqsjobs:app", "--burst"],
    "enqueue": ["enqueue", "sqsjobs:app", "hello", '"ada"'],
    "status": ["status", "sqsjobs:app"],
}


def _broker(endpoint: str) -> list[str]:
    return ["--broker", f"sqs://cli-test?create=1&wait=1&endpoint_url={endpoint}"]


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    ("env", "status", "said"),
    [
        (CREDENTIALS, 2, "no AWS region: set AWS_DEFAULT_REGION or add ?region=... to the URL"),
        (REGION, 2, "sqs://cli-test: no AWS credentials found"),
        ({**REGION, "AWS_ACCESS_KEY_ID": "testing"}, 2, "AWS credentials are incomplete"),
        ({**REGION, **CREDENTIALS}, 2, "sqs://cli-test: AWS refused the credentials"),
    ],
    ids=["no-region", "no-credentials", "partial-credentials", "refused-credentials"],
)
def test_sqs_set_up_mistakes_are_one_line(
    project: Path,
    strict_moto: str,
    command: str,
    env: dict[str, str],
    status: int,
    said: str,
) -> None:
    argv = [*COMMANDS[command], *_broker(strict_moto), "--log-level", "WARNING"]
    line = one_line_error(aqw(project, *argv, env=env), status)
    assert said in line


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_sqs_endpoint_nobody_listens_on_is_one_line(project: Path, command: str) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    argv = [*COMMANDS[command], *_broker(closed), "--log-level", "WARNING"]
    line = one_line_error(aqw(project, *argv, env={**REGION, **CREDENTIALS}), 1)
    assert f"cannot reach SQS at {closed}" in line and "sqs://cli-test" in line


# -- the event loop: --loop, AQW_LOOP ------------------------------------------------------------

LOOP_APP_SOURCE = """
import asyncio
import gc

import aqw

app = aqw.App("memory://loop")


@app.task
async def which_loop() -> None:
    loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
    print("loop:", loop, "frozen:", gc.get_freeze_count() > 0, flush=True)
"""


@pytest.mark.redis
@pytest.mark.parametrize(
    ("argv", "env", "loop"),
    [
        (["--loop", "uvloop"], {}, "uvloop"),
        ([], {"AQW_LOOP": "uvloop"}, "uvloop"),
        (["--loop", "asyncio"], {"AQW_LOOP": "uvloop"}, "asyncio"),  # the option wins
        ([], {}, "asyncio"),
    ],
    ids=["option", "env", "option-wins", "default"],
)
def test_a_burst_worker_runs_its_jobs_on_the_loop_it_is_given_with_its_heap_frozen(
    project: Path, redis_url: str, queue_name: str, argv: list[str], env: dict[str, str], loop: str
) -> None:
    (project / "loopjobs.py").write_text(LOOP_APP_SOURCE)
    target = ["--broker", redis_url, "--queue", queue_name]
    enqueued = aqw(project, "enqueue", "loopjobs:app", "which_loop", *target)
    assert enqueued.returncode == 0, explain(enqueued)
    result = aqw(project, "worker", "loopjobs:app", *target, "--burst", *argv, env=env)
    assert result.returncode == 0, explain(result)
    # and the start-up heap was frozen (out of the full collections' way) before it ran
    assert result.stdout.splitlines() == [f"loop: {loop} frozen: True"], explain(result)
    assert re.search(r"stopped after \d+\.\ds: 1 succeeded", result.stderr), explain(result)


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--loop", "trio"], {}, "--loop"),
        ([], {"AQW_LOOP": "trio"}, "AQW_LOOP"),
    ],
    ids=["option", "env"],
)
def test_an_unknown_loop_is_one_line(
    project: Path, argv: list[str], env: dict[str, str], named: str
) -> None:
    line = one_line_error(aqw(project, "worker", "jobs:app", "--burst", *argv, env=env), 2)
    assert named in line and "trio" in line


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["--loop", "uvloop"], {}),
        ([], {"AQW_LOOP": "uvloop"}),
        (["--loop", "uvloop", "--processes", "2"], {}),
    ],
    ids=["option", "env", "processes"],
)
def test_uvloop_without_the_extra_is_one_line_naming_it(
    project: Path, argv: list[str], env: dict[str, str]
) -> None:
    # A module of that name first on the path that fails to import, as a missing one does.
    (project / "uvloop.py").write_text("raise ImportError(\"No module named 'uvloop'\")\n")
    line = one_line_error(aqw(project, "worker", "jobs:app", "--burst", *argv, env=env), 2)
    assert "pip install uvloop (the uvloop extra;" in line, line
