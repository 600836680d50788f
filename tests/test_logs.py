"""A log line per job (logger ``aqw.worker``), each carrying ``job_id``, ``task`` and
``attempt`` as record fields; and the command line's ``text`` and ``json`` log formats
(``aqw.cli._logs.configure_logging``), with the OpenTelemetry trace and span ids in JSON."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import AsyncIterator, Iterator

import pytest
from conftest import Backend, open_backend
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel, ValidationError

import aqw
from aqw.cli._common import CliError, setup_logging
from aqw.cli._logs import HANDLER_NAME, configure_logging
from aqw.context import JobLog, job_fields
from aqw.worker._attempts import LOG_TRACEBACK_CHARS
from tests._helpers import run_burst

pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("error")]

SECRET = "sk_live_51HxSECRETxCARD4242"
FAST = aqw.RetryPolicy(max_retries=1, base=0.01, cap=0.02)


@pytest.fixture(params=["memory", "fakeredis"])
async def backend(request: pytest.FixtureRequest, queue_name: str) -> AsyncIterator[Backend]:
    async with open_backend(request.param, queue_name) as b:
        yield b


@pytest.fixture
def root_logging() -> Iterator[None]:
    """Put the root logger's handlers and level back after a test that configures it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def worker_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "aqw.worker" and r.levelno == level]


def about(records: list[logging.LogRecord], job_id: str) -> list[logging.LogRecord]:
    return [r for r in records if job_id in r.getMessage()]


class Card(BaseModel):
    number: int


async def test_a_succeeded_job_logs_one_info_line_with_its_duration(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    app = backend.app()

    @app.task(name="greet")
    async def greet(name: str) -> None:
        pass

    job_id = await greet.enqueue("ada")
    with caplog.at_level(logging.DEBUG, logger="aqw"):
        await run_burst(app)
    [done] = about(worker_records(caplog, logging.INFO), job_id)
    assert re.fullmatch(
        rf"job {job_id} \(greet\) attempt 1 succeeded in \d+\.\d ms", done.getMessage()
    ), done.getMessage()
    assert (done.job_id, done.task, done.attempt) == (job_id, "greet", 1)  # type: ignore[attr-defined]
    assert done.duration_ms >= 0  # type: ignore[attr-defined]
    [started] = about(worker_records(caplog, logging.DEBUG), job_id)
    assert started.getMessage() == f"job {job_id} (greet) attempt 1 started"
    assert (started.job_id, started.task, started.attempt) == (job_id, "greet", 1)  # type: ignore[attr-defined]


async def test_a_failed_attempt_logs_a_warning_with_the_redacted_traceback(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    app = backend.app(retry=FAST)

    @app.task(name="charge")
    async def charge(number: str) -> None:
        try:
            Card.model_validate({"number": number})
        except ValidationError as exc:
            raise RuntimeError("the card was refused") from exc

    job_id = await charge.enqueue(SECRET)
    with caplog.at_level(logging.INFO, logger="aqw"):
        await run_burst(app)
    [warning] = about(worker_records(caplog, logging.WARNING), job_id)
    text = warning.getMessage()
    assert text.startswith(
        f"job {job_id} (charge) attempt 1 failed: RuntimeError: the card was refused; retrying in"
    ), text
    assert "Traceback (most recent call last)" in text
    assert 'raise RuntimeError("the card was refused") from exc' in text  # the frames are kept
    assert "ValidationError: number: Input should be a valid integer" in text  # the cause
    assert SECRET not in text, "the payload's value leaked into the log"
    assert len(text) < LOG_TRACEBACK_CHARS + 500
    assert warning.exc_info is None  # no second, unredacted traceback from the handler
    assert (warning.job_id, warning.task, warning.attempt) == (job_id, "charge", 1)  # type: ignore[attr-defined]
    # the last attempt is dead-lettered, with its own traceback, once
    [error] = about(worker_records(caplog, logging.ERROR), job_id)
    assert f"job {job_id} (charge) attempt 2 dead-lettered" in error.getMessage()
    assert error.getMessage().count('raise RuntimeError("the card was refused")') == 1
    assert SECRET not in error.getMessage()
    assert SECRET not in caplog.text


async def test_unredacted_apps_log_the_raw_traceback(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """The log follows ``App(redact_errors=...)`` as the DLQ does (and so the check above
    sees a real redaction, not a traceback that never had the value)."""
    app = backend.app(retry=FAST, redact_errors=False)

    @app.task(name="charge")
    async def charge(number: str) -> None:
        try:
            Card.model_validate({"number": number})
        except ValidationError as exc:
            raise RuntimeError("the card was refused") from exc

    job_id = await charge.enqueue(SECRET)
    with caplog.at_level(logging.INFO, logger="aqw"):
        await run_burst(app)
    [warning] = about(worker_records(caplog, logging.WARNING), job_id)
    assert SECRET in warning.getMessage()


async def test_a_dead_lettered_job_logs_an_error_naming_its_dlq_entry(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    app = backend.app()

    @app.task(name="refuse")
    async def refuse(n: int) -> None:
        raise aqw.Reject(f"order {n} was cancelled")

    job_id = await refuse.enqueue(42)
    with caplog.at_level(logging.INFO, logger="aqw"):
        await run_burst(app)
    [error] = about(worker_records(caplog, logging.ERROR), job_id)
    text = error.getMessage()
    found = re.search(r"; DLQ entry (\S+) \(aqw dlq show (\S+)\)", text)
    assert found, text
    entry_id = found[1]
    assert found[2] == entry_id == error.dlq_entry  # type: ignore[attr-defined]
    assert text.startswith(
        f"job {job_id} (refuse) attempt 1 dead-lettered: Reject: order 42 was cancelled"
    ), text
    assert (error.job_id, error.task, error.attempt) == (job_id, "refuse", 1)  # type: ignore[attr-defined]
    dead = await app.dlq.get(entry_id)
    assert dead is not None, f"DLQ entry {entry_id} not found"
    assert (dead.id, dead.job_id, dead.task) == (entry_id, job_id, "refuse")
    assert not about(worker_records(caplog, logging.WARNING), job_id)  # no retry was logged


async def test_a_refused_job_is_logged_with_its_dlq_entry_too(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """A job the worker refuses before running it (here: a payload that does not validate)
    is dead-lettered with the same ERROR line."""
    app = backend.app()

    @app.task(name="count")
    async def count(n: int) -> None:
        pass

    bad = aqw.Job(task="count", payload="many")
    await app.broker.connect()
    await app.broker.publish([bad])
    job_id = bad.id
    with caplog.at_level(logging.INFO, logger="aqw"):
        await run_burst(app)
    [error] = about(worker_records(caplog, logging.ERROR), job_id)
    assert "payload failed validation" in error.getMessage()
    assert await app.dlq.get(error.dlq_entry) is not None  # type: ignore[attr-defined]


async def test_every_record_about_a_job_carries_its_fields(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    app = backend.app(retry=FAST)

    @app.task(name="flaky")
    async def flaky(n: int, ctx: aqw.Context) -> None:
        ctx.log.info("working on %d", n, extra={"order": n})
        if ctx.attempt == 1:
            raise ConnectionError("upstream hung up")

    job_id = await flaky.enqueue(7)
    with caplog.at_level(logging.DEBUG, logger="aqw"):
        await run_burst(app)
    mine = [r for r in caplog.records if r.name == "aqw.job"]
    assert [(r.getMessage(), r.attempt) for r in mine] == [("working on 7", 1), ("working on 7", 2)]  # type: ignore[attr-defined]
    for record in mine:
        assert (record.job_id, record.task, record.order) == (job_id, "flaky", 7)  # type: ignore[attr-defined]
    worker = about([r for r in caplog.records if r.name == "aqw.worker"], job_id)
    # started, failed (retrying), started, succeeded
    assert len(worker) == 4, [r.getMessage() for r in worker]
    for record in worker:
        fields = (record.job_id, record.task)  # type: ignore[attr-defined]
        assert fields == (job_id, "flaky"), record.getMessage()
        assert f"attempt {record.attempt}" in record.getMessage()  # type: ignore[attr-defined]


def test_the_job_adapter_keeps_the_callers_extra() -> None:
    job = aqw.Job(task="t")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("aqw.test-adapter")
    logger.propagate = False
    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)
    JobLog(logger, job_fields(job)).info("x", extra={"order": 1, "task": "not this"})
    [record] = records
    assert (record.job_id, record.task, record.attempt, record.order) == (job.id, "t", 1, 1)  # type: ignore[attr-defined]


# -- the command line's formats -----------------------------------------------------------------


@pytest.mark.usefixtures("root_logging")
async def test_json_lines_carry_the_job_fields_and_the_trace(queue_name: str) -> None:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    stream = io.StringIO()
    configure_logging("INFO", "json", stream=stream, force=True)
    async with open_backend("memory", queue_name) as b:
        app = b.app(tracer_provider=tp)

        @app.task(name="greet")
        async def greet(name: str, ctx: aqw.Context) -> None:
            ctx.log.warning("hello %s", name)

        job_id = await greet.enqueue("ada")
        await run_burst(app)
    lines = stream.getvalue().splitlines()
    docs = [json.loads(line) for line in lines]  # one JSON object per line
    assert all(isinstance(doc, dict) for doc in docs)
    about_job = [d for d in docs if d.get("job_id") == job_id]
    assert [(d["logger"], d["level"]) for d in about_job] == [
        ("aqw.job", "WARNING"),
        ("aqw.worker", "INFO"),
    ]
    said, done = about_job
    assert (said["message"], said["task"], said["attempt"]) == ("hello ada", "greet", 1)
    assert re.fullmatch(r"job \S+ \(greet\) attempt 1 succeeded in \d+\.\d ms", done["message"])
    assert (done["task"], done["attempt"]) == ("greet", 1) and done["duration_ms"] >= 0
    assert "time" in said and "time" in done
    # One span per job by default: the handler runs with the job's `process` span current.
    [job_span] = [s for s in exporter.get_finished_spans() if s.name == f"process {queue_name}"]
    ctx = job_span.get_span_context()
    assert ctx is not None
    ids = (f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
    assert (said["trace_id"], said["span_id"]) == ids
    assert (done.get("trace_id"), done.get("span_id")) in (ids, (None, None))
    workers = [d for d in docs if d["message"].startswith("worker ")]
    assert workers and all("job_id" not in d for d in workers)  # lines about no job parse too


@pytest.mark.usefixtures("root_logging")
async def test_text_lines_show_the_job_fields(queue_name: str) -> None:
    stream = io.StringIO()
    configure_logging("info", "text", stream=stream, force=True)
    async with open_backend("memory", queue_name) as b:
        app = b.app()

        @app.task(name="greet")
        async def greet(name: str) -> None:
            pass

        job_id = await greet.enqueue("ada")
        await run_burst(app)
    [line] = [x for x in stream.getvalue().splitlines() if job_id in x]
    assert re.fullmatch(
        rf"\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d INFO aqw\.worker job={job_id} task=greet attempt=1 "
        r"succeeded in \d+\.\d ms",
        line,
    ), line
    assert "worker" in stream.getvalue() and "started" in stream.getvalue()  # lines without a job


@pytest.mark.usefixtures("root_logging")
def test_configure_logging_replaces_its_handler_and_respects_the_hosts() -> None:
    root = logging.getLogger()
    first, second = io.StringIO(), io.StringIO()
    configure_logging("WARNING", "text", stream=first, force=True)
    configure_logging("WARNING", "json", stream=second, force=True)
    assert [h.get_name() for h in root.handlers].count(HANDLER_NAME) == 1
    logging.getLogger("aqw.test").warning("once")
    assert first.getvalue() == "" and json.loads(second.getvalue())["message"] == "once"
    # pytest's own handlers are on the root logger: a host that configured logging
    third = io.StringIO()
    configure_logging("DEBUG", "text", stream=third)
    logging.getLogger("aqw.test").warning("twice")
    assert third.getvalue() == "", "a handler was added to a configured host"


@pytest.mark.usefixtures("root_logging")
def test_bad_formats_and_levels_are_one_line_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown log format 'xml'"):
        configure_logging("INFO", "xml")
    with pytest.raises(ValueError, match="unknown log level 'LOUD'"):
        configure_logging("LOUD", "text")
    with pytest.raises(CliError) as caught:
        setup_logging("INFO", fmt="yaml")
    assert "\n" not in str(caught.value) and "'yaml'" in str(caught.value)
    monkeypatch.setenv("AQW_LOG_FORMAT", "xml")
    with pytest.raises(CliError, match="'xml'"):
        setup_logging("INFO")
    monkeypatch.setenv("AQW_LOG_FORMAT", "JSON")
    setup_logging("INFO")  # the variable is read case-insensitively (a no-op under pytest)
