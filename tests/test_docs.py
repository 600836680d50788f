"""The documentation: the site builds in strict mode, every sample it shows runs, and what it
states about metric names, CLI commands and Kubernetes manifests matches the code.

- ``mkdocs build --strict`` must succeed (broken links, missing snippet files and docstring
  warnings fail it).
- Every ``examples/docs/*.py`` runs as a subprocess and must exit 0 within its timeout.
  Samples that read ``AQW_REDIS_URL`` get the real Redis (``AQW_TEST_REDIS_URL``, by default
  127.0.0.1:6379), those that read ``AQW_PG_DSN`` the PostgreSQL (``AQW_TEST_PG_DSN``, by
  default 127.0.0.1:5432), those that read ``AQW_SQS_ENDPOINT`` a
  moto server started here on loopback. Every Python block in the pages is such a file,
  included with ``--8<--``.
- The metrics table equals ``aqw.telemetry.METRICS``; the Prometheus rules use only metric
  names aqw exports.
- Every ``aqw SUB`` command the pages show exists in ``python -m aqw --help`` and accepts the
  options shown.
- The Kubernetes examples agree with each other and with aqw's key names.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml

from aqw._redis.keys import QueueKeys
from aqw.cli._main import build_parser
from aqw.telemetry import METRICS
from tests._cli_runs import run_aqw, run_script
from tests._helpers import PG_DSNS, REDIS_URL, moto_server, pg_where, require_real_redis

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXAMPLES = ROOT / "examples" / "docs"

#: Pages written by others, not held to the rules of the pages written here.
NOT_OURS = {"design.md", "benchmarks.md"}


SAMPLES = sorted(EXAMPLES.glob("*.py"))


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _our_pages() -> list[Path]:
    return [p for p in _pages() if p.relative_to(DOCS).as_posix() not in NOT_OURS]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def _run(args: list[str], timeout: float, **extra: str) -> subprocess.CompletedProcess[str]:
    """``args`` run in the repository with the docs' environment: ``python -m aqw ...`` and
    ``python sample.py`` forked by ``tests/_cli_runs.py`` (a process each, without aqw's
    start-up each time), anything else as a subprocess."""
    if args[:3] == [sys.executable, "-m", "aqw"]:
        return run_aqw(args[3:], ROOT, _env(**extra), timeout)
    if len(args) == 2 and args[0] == sys.executable and args[1].endswith(".py"):
        return run_script(Path(args[1]), ROOT, _env(**extra), timeout)
    return subprocess.run(
        args, cwd=ROOT, env=_env(**extra), capture_output=True, text=True, timeout=timeout
    )


def _explain(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


# -- the site ---------------------------------------------------------------------------------


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    result = _run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(site),
        ],
        timeout=300,
    )
    assert result.returncode == 0, _explain(result)
    for page in (
        "index.html",
        "quickstart/index.html",
        "operations/metrics/index.html",
        "reference/app/index.html",
        "design/index.html",
        "benchmarks/index.html",
    ):
        assert (site / page).is_file(), f"{page} missing from the built site"
    leftovers = [
        p for p in site.rglob("*.html") if "--8&lt;--" in p.read_text() or "--8<--" in p.read_text()
    ]
    assert not leftovers, f"snippet markers left unexpanded in {leftovers}"
    api = (site / "reference" / "app" / "index.html").read_text()
    assert "enqueue_many" in api, "the API reference did not render App/Task from docstrings"


def test_python_blocks_are_included_sample_files() -> None:
    """Every Python block shows a file of examples/docs (which the tests run), nothing else."""
    offenders = []
    for page in _our_pages():
        for info, body in _fenced_blocks(page.read_text()):
            if info.split(" ")[0] not in ("python", "py", "pycon"):
                continue
            lines = [line for line in body.strip().splitlines() if line.strip()]
            if len(lines) != 1 or not re.fullmatch(r'--8<-- "examples/[\w/.-]+\.py"', lines[0]):
                offenders.append(f"{page.relative_to(ROOT)}: {body.strip()[:80]!r}")
    assert not offenders, "Python blocks that are not an included sample:\n" + "\n".join(offenders)


def test_every_sample_is_shown_and_every_include_exists() -> None:
    included = set()
    for page in _pages():
        for name in re.findall(r'--8<-- "([^"]+)"', page.read_text()):
            assert (ROOT / name).is_file(), f"{page.relative_to(ROOT)} includes missing {name}"
            included.add(name)
    shown = {f"examples/docs/{p.name}" for p in SAMPLES}
    assert not shown - included, f"samples no page shows: {sorted(shown - included)}"


# -- the samples ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """An SQS-compatible moto server on loopback for the SQS samples."""
    with moto_server() as endpoint:
        yield endpoint


def _postgres_dsn() -> str:
    """The DSN of the local PostgreSQL, found as the SQL store's tests find it."""
    import asyncpg

    async def probe(dsn: str) -> None:
        conn = await asyncpg.connect(dsn, timeout=5)
        await conn.close()

    errors = []
    for dsn in PG_DSNS:
        try:
            asyncio.run(probe(dsn))
        except Exception as exc:
            errors.append(f"{pg_where(dsn)}: {exc!r}")
            continue
        return dsn
    pytest.fail(
        f"PostgreSQL is not answering (AQW_TEST_PG_DSN): {'; '.join(errors)}", pytrace=False
    )


@pytest.mark.parametrize("sample", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_sample_runs(sample: Path, request: pytest.FixtureRequest) -> None:
    source = sample.read_text()
    extra: dict[str, str] = {}
    if "AQW_REDIS_URL" in source:
        require_real_redis()
        extra["AQW_REDIS_URL"] = REDIS_URL
    if "AQW_PG_DSN" in source:
        extra["AQW_PG_DSN"] = _postgres_dsn()
    if "AQW_SQS_ENDPOINT" in source:
        extra.update(
            AQW_SQS_ENDPOINT=request.getfixturevalue("moto_endpoint"),
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION="us-east-1",
            AWS_SESSION_TOKEN="testing",
        )
    result = _run([sys.executable, str(sample)], timeout=60, **extra)
    assert result.returncode == 0, _explain(result)


def test_quickstart_commands_against_redis() -> None:
    """The quickstart's `aqw enqueue` and `aqw worker --burst` lines, on a private queue."""
    require_real_redis()
    queue = f"docs-{uuid.uuid4().hex[:8]}"
    target = ["--broker", REDIS_URL, "--queue", queue]
    app = "examples.docs.first_task:app"
    try:
        enqueued = _run(
            [
                sys.executable,
                "-m",
                "aqw",
                "enqueue",
                app,
                "send_welcome",
                '{"email": "ada@example.com"}',
                *target,
            ],
            timeout=30,
        )
        assert enqueued.returncode == 0, _explain(enqueued)
        assert re.fullmatch(r"[0-9a-f]{32}\n", enqueued.stdout), enqueued.stdout
        worked = _run([sys.executable, "-m", "aqw", "worker", app, *target, "--burst"], timeout=60)
        assert worked.returncode == 0, _explain(worked)
        assert re.search(r"stopped after \d+\.\ds: 1 succeeded", worked.stderr), worked.stderr
    finally:
        client = redis.Redis.from_url(REDIS_URL)
        try:
            keys = list(client.scan_iter(match=QueueKeys(queue).pattern(), count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()


# -- metrics ----------------------------------------------------------------------------------


def _prometheus_name(name: str, kind: str, unit: str) -> str:
    out = name.replace(".", "_")
    if unit == "s":
        out += "_seconds"
    if kind == "counter":
        out += "_total"
    return out


def _metrics_table() -> dict[str, tuple[str, str, str, str]]:
    text = (DOCS / "operations" / "metrics.md").read_text()
    row = re.compile(
        r"^\| `(aqw\.[a-z_.]+)` \| (\w+) \| `([^`]+)` \| ([^|]+?) \| `(\w+)` \|$", re.M
    )
    rows = {m[0]: (m[1], m[2], m[3], m[4]) for m in row.findall(text)}
    assert rows, "no metrics table found in docs/operations/metrics.md"
    return rows


def test_metrics_table_matches_telemetry() -> None:
    table = _metrics_table()
    assert list(table) == list(METRICS), "the table must list METRICS' names, in order"
    for name, (kind, unit, description) in METRICS.items():
        assert table[name][:3] == (kind, unit, description), name
        assert table[name][3] == _prometheus_name(name, kind, unit), name


def test_prometheus_rules_use_exported_metrics() -> None:
    exported = set()
    for name, (kind, unit, _) in METRICS.items():
        prom = _prometheus_name(name, kind, unit)
        exported |= {prom, f"{prom}_bucket", f"{prom}_sum", f"{prom}_count"}
    rules = yaml.safe_load((DOCS / "alerts" / "prometheus-rules.yml").read_text())
    used = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            used |= set(re.findall(r"(?<![\w:])aqw_[a-z_]+", rule["expr"]))
    used -= {"aqw_task", "aqw_worker"}  # labels (the attributes aqw.task, aqw.worker)
    assert used, "no aqw metric found in the Prometheus rules"
    assert used <= exported, f"unknown metrics in the rules: {sorted(used - exported)}"


# -- the command line -------------------------------------------------------------------------


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of every fenced code block of a page."""
    blocks: list[tuple[str, str]] = []
    info: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        if info is None and line.startswith("```"):
            info, body = line[3:].strip(), []
        elif info is not None and line.strip() == "```":
            blocks.append((info, "\n".join(body)))
            info = None
        elif info is not None:
            body.append(line)
    return blocks


def _commands() -> list[list[str]]:
    """Every `aqw ...` command line the pages show (shell blocks and inline code)."""
    lines: list[str] = []
    for page in _our_pages():
        text = page.read_text()
        for info, body in _fenced_blocks(text):
            if info.split(" ")[0] in ("", "bash", "console", "sh", "shell"):
                lines += body.replace("\\\n", " ").splitlines()
        prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
        lines += re.findall(r"`(aqw [^`]+)`", prose)
    commands = []
    for line in lines:
        line = line.split(" #", 1)[0].strip()
        match = re.search(r"(?:^|[\s;&|(])aqw\s+(.*)$", line)
        if match:
            commands.append(match[1].split())
    return commands


def _subcommand(words: list[str]) -> str:
    """``worker`` or ``dlq list``: the (sub)command a command line runs."""
    words = [w for w in words if not w.startswith("-")]
    if not words:
        return ""
    if words[0] == "dlq" and len(words) > 1 and words[1] in ("list", "show", "replay", "purge"):
        return f"dlq {words[1]}"
    if words[0] == "job" and len(words) > 1 and words[1] in ("show", "wait", "cancel", "release"):
        return f"job {words[1]}"
    queue_commands = ("pause", "resume", "status", "promote", "delete")
    if words[0] == "queue" and len(words) > 1 and words[1] in queue_commands:
        return f"queue {words[1]}"
    if words[0] == "cron" and len(words) > 1 and words[1] == "list":
        return "cron list"
    if words[0] == "limits" and len(words) > 1 and words[1] in ("show", "set", "reset"):
        return f"limits {words[1]}"
    if words[0] in ("outbox", "db") and len(words) > 1:
        return f"{words[0]} {words[1]}"  # outbox status|relay, db migrate|sql
    return words[0]


def _documented() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for words in _commands():
        sub = _subcommand(words)
        if sub and re.fullmatch(r"[a-z]+( [a-z]+)?", sub):
            options = {w.split("=", 1)[0] for w in words if w.startswith("--")}
            out.setdefault(sub, set()).update(options)
    return out


DOCUMENTED = _documented()


@functools.cache
def _listed_subcommands() -> frozenset[str]:
    """The subcommands ``aqw --help`` lists, from the real command (once per process)."""
    result = _run([sys.executable, "-m", "aqw", "--help"], timeout=60)
    assert result.returncode == 0, _explain(result)
    match = re.search(r"\{([a-z,]*worker[a-z,]*)\}", result.stdout)  # not {text,json}
    assert match, result.stdout
    return frozenset(match[1].split(","))


def _help_of(sub: str) -> str:
    """``aqw SUB --help``, from the CLI's own parser in this process: a subprocess each
    (a Python start and aqw's import, seconds on a loaded machine) bought nothing more."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([*sub.split(), "--help"])
    assert exit_.value.code == 0, out.getvalue()
    return out.getvalue()


def test_docs_show_the_main_commands() -> None:
    assert {"worker", "enqueue", "status", "dlq list", "monitor"} <= set(DOCUMENTED)


@pytest.mark.parametrize("sub", sorted(DOCUMENTED))
def test_documented_command_exists(sub: str) -> None:
    assert sub.split()[0] in _listed_subcommands(), f"`aqw {sub}` is documented but not listed"
    text = _help_of(sub)
    missing = sorted(o for o in DOCUMENTED[sub] if not re.search(rf"{re.escape(o)}\b", text))
    assert not missing, f"`aqw {sub} --help` does not know {missing}:\n{text}"


# -- Kubernetes examples ----------------------------------------------------------------------


def _manifests() -> dict[str, dict[str, object]]:
    out = {}
    for path in sorted((EXAMPLES / "k8s").glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        assert len(docs) == 1, path
        out[path.name] = docs[0]
    return out


def test_kubernetes_examples_agree() -> None:
    manifests = _manifests()
    deployment = manifests["worker-deployment.yaml"]
    assert deployment["kind"] == "Deployment"
    pod = deployment["spec"]["template"]["spec"]  # type: ignore[index]
    container = pod["containers"][0]
    command = container["command"]
    assert command[:2] == ["aqw", "worker"], command
    grace = float(command[command.index("--grace") + 1])
    assert pod["terminationGracePeriodSeconds"] > grace, "the pod must outlive the worker's grace"
    env = {e["name"]: e.get("value") for e in container["env"]}
    queue = env["AQW_QUEUE"]

    redis_scaler = manifests["keda-redis-streams.yaml"]
    sqs_scaler = manifests["keda-sqs.yaml"]
    for scaler in (redis_scaler, sqs_scaler):
        assert scaler["kind"] == "ScaledObject"
        target = scaler["spec"]["scaleTargetRef"]["name"]  # type: ignore[index]
        assert target == deployment["metadata"]["name"]  # type: ignore[index]
    trigger = redis_scaler["spec"]["triggers"][0]  # type: ignore[index]
    assert trigger["type"] == "redis-streams"
    assert trigger["metadata"]["stream"] == QueueKeys(queue).stream
    assert "consumerGroup" not in trigger["metadata"], "streamLength mode has no group"
    assert trigger["metadata"]["addressFromEnv"] in env
    sqs_trigger = sqs_scaler["spec"]["triggers"][0]  # type: ignore[index]
    assert sqs_trigger["type"] == "aws-sqs-queue"
    assert sqs_trigger["metadata"]["queueURL"].endswith("/" + queue)
