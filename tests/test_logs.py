"""A log line per job (logger ``aqw.worker``), each carrying ``job_id``, ``task`` and
``attempt`` as record fields; and the command line's ``text`` and ``json`` log formats
(``aqw.cli._logs.configure_logging``), with the OpenTelemetry trace and span ids in JSON."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import time
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
    began = time.monotonic()
    with caplog.at_level(logging.DEBUG, logger="aqw"):
        await run_burst(app)
    ran_ms = (time.monotonic() - began) * 1000
    [done] = about(worker_records(caplog, logging.INFO), job_id)
    assert re.fullmatch(
        rf"job {job_id} \(greet\) attempt 1 succeeded in \d+\.\d ms", done.getMessage()
    ), done.getMessage()
    assert (done.job_id, done.task, done.attempt) == (job_id, "greet", 1)  # type: ignore[attr-defined]
    # the message's figure, and no longer than the whole run took
    assert done.getMessage().endswith(f" in {done.duration_ms:.1f} ms")  # type: ignore[attr-defined]
    assert 0 <= done.duration_ms <= ran_ms  # type: ignore[attr-defined]
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
    text, tb = warning.getMessage(), warning.exc_text or ""
    assert re.fullmatch(
        f"job {job_id} \\(charge\\) attempt 1 failed: RuntimeError: the card was refused; "
        r"retrying in \d+\.\d\ds",
        text,
    ), text  # one line: the traceback is the record's exc_text, not in the message
    assert tb.startswith("Traceback (most recent call last)"), tb
    assert 'raise RuntimeError("the card was refused") from exc' in tb  # the frames are kept
    assert "ValidationError: number: Input should be a valid integer" in tb  # the cause
    assert SECRET not in tb, "the payload's value leaked into the log"
    assert len(tb) < LOG_TRACEBACK_CHARS + 500
    assert warning.exc_info is None  # no second, unredacted traceback from the handler
    assert (warning.job_id, warning.task, warning.attempt) == (job_id, "charge", 1)  # type: ignore[attr-defined]
    # the last attempt is dead-lettered, with its own traceback, once
    [error] = about(worker_records(caplog, logging.ERROR), job_id)
    assert f"job {job_id} (charge) attempt 2 dead-lettered" in error.getMessage()
    assert "\n" not in error.getMessage()
    assert (error.exc_text or "").count('raise RuntimeError("the card was refused")') == 1
    assert SECRET not in (error.exc_text or "")
    assert caplog.text.count('raise RuntimeError("the card was refused")') == 2  # printed
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
    assert SECRET in (warning.exc_text or "")


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
        began = time.monotonic()
        await run_burst(app)
        ran_ms = (time.monotonic() - began) * 1000
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
    assert (done["task"], done["attempt"]) == ("greet", 1)
    assert done["message"].endswith(f" in {done['duration_ms']:.1f} ms")
    assert 0 <= done["duration_ms"] <= ran_ms  # no longer than the whole run
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


# -- the fields of every finished attempt, the start and stop lines -----------------------

OUTCOMES = {"succeeded", "failed", "retrying", "dead", "cancelled", "expired"}


@pytest.mark.usefixtures("root_logging")
async def test_every_finished_attempt_line_has_its_outcome_duration_and_error_type(
    queue_name: str,
) -> None:
    """One JSON line per finished attempt, whatever its outcome, with ``outcome`` and
    ``duration_ms``; failures add ``error_type`` and their traceback as ``exc_info``, the
    ``message`` staying one line (as docs/operations/cli.md says)."""
    stream = io.StringIO()
    configure_logging("INFO", "json", stream=stream, force=True)
    async with open_backend("memory", queue_name) as b:
        app = b.app(retry=FAST)

        @app.task(name="fine")
        async def fine() -> None:
            pass

        @app.task(name="flaky")
        async def flaky() -> None:
            raise ValueError("flaky broke")

        @app.task(name="no_dlq", dead_letter=False, max_retries=0)
        async def no_dlq() -> None:
            raise KeyError("gone")

        ids = {
            "fine": await fine.enqueue(),
            "flaky": await flaky.enqueue(),
            "no_dlq": await no_dlq.enqueue(),
            "cancelled": await fine.enqueue(),
            "expired": await fine.enqueue(expires=0.05),
        }
        assert await app.cancel(ids["cancelled"]) == "cancelled"
        await asyncio.sleep(0.1)  # past the expiry of the last one
        began = time.monotonic()
        await run_burst(app)
        ran_ms = (time.monotonic() - began) * 1000
    docs = [json.loads(line) for line in stream.getvalue().splitlines()]
    finished = [d for d in docs if "outcome" in d]
    by_job = {
        job: [d["outcome"] for d in finished if d.get("job_id") == j] for job, j in ids.items()
    }
    assert by_job == {
        "fine": ["succeeded"],
        "flaky": ["retrying", "dead"],
        "no_dlq": ["failed"],
        "cancelled": ["cancelled"],
        "expired": ["expired"],
    }, by_job
    for doc in finished:
        assert doc["outcome"] in OUTCOMES
        assert isinstance(doc["duration_ms"], float), doc
        assert 0 <= doc["duration_ms"] <= ran_ms, doc  # no longer than the whole run
        assert "\n" not in doc["message"], doc
        failed = doc["outcome"] in ("retrying", "dead", "failed")
        assert ("error_type" in doc) == failed, doc
        assert ("exc_info" in doc) == failed, doc
    [dead] = [d for d in finished if d["outcome"] == "dead"]
    assert dead["error_type"] == "ValueError" and dead["dlq_entry"]
    assert dead["exc_info"].startswith("Traceback (most recent call last)")
    assert dead["exc_info"].rstrip().endswith("ValueError: flaky broke")
    [failed] = [d for d in finished if d["outcome"] == "failed"]
    assert failed["error_type"] == "KeyError"


@pytest.mark.usefixtures("root_logging")
async def test_a_text_line_prints_the_traceback_under_the_message(queue_name: str) -> None:
    stream = io.StringIO()
    configure_logging("INFO", "text", stream=stream, force=True)
    async with open_backend("memory", queue_name) as b:
        app = b.app(retry=aqw.RetryPolicy(max_retries=0))

        @app.task(name="broken")
        async def broken() -> None:
            raise ValueError("broken for good")

        job_id = await broken.enqueue()
        await run_burst(app)
    lines = stream.getvalue().splitlines()
    [at] = [i for i, line in enumerate(lines) if f"job={job_id}" in line]
    assert " ERROR aqw.worker " in lines[at] and "dead-lettered" in lines[at]
    assert lines[at + 1] == "Traceback (most recent call last):"
    assert "ValueError: broken for good" in lines[at + 2 : at + 6]


@pytest.mark.redis
async def test_the_start_line_names_the_broker_and_the_stop_line_sums_up_once(
    queue_name: str, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = aqw.App(redis_url, queue=queue_name, retry=FAST)

    @app.task(name="half")
    async def half(n: int) -> None:
        if n % 2:
            raise ValueError("odd")

    try:
        await half.enqueue_many([1, 2, 3, 4])
        with caplog.at_level(logging.INFO, logger="aqw.worker"):
            worker = await run_burst(app)
    finally:
        await app.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "aqw.worker"]
    [start] = [line for line in lines if " started on " in line]
    host = redis_url.split("://", 1)[1].split("/", 1)[0]
    assert f"started on redis://{host}/0 queue={queue_name}: " in start, start
    [stop] = [line for line in lines if " stopped after " in line]
    assert re.fullmatch(
        rf"worker {worker.name} stopped after \d+\.\ds: 2 succeeded, 2 retried, "
        r"2 dead-lettered; 4 failed attempts in all",
        stop,
    ), stop
    [record] = [r for r in caplog.records if " stopped after " in r.getMessage()]
    assert record.stats["processed"] == 2  # type: ignore[attr-defined]


def test_a_brokers_description_never_shows_its_password() -> None:
    app = aqw.App("redis://user:s3cr3t-pw@127.0.0.1:6379/4", queue="q")
    assert app.broker.describe() == "redis://127.0.0.1:6379/4 queue=q"


@pytest.mark.redis
@pytest.mark.usefixtures("root_logging")
async def test_debug_logs_hide_redis_maint_notifications_noise(redis_url: str) -> None:
    """redis-py says "Failed to enable maintenance notifications" at DEBUG on every new
    connection to a server older than Redis 8; the command line's handler drops it."""
    import redis.asyncio as aioredis

    from aqw.cli._logs import REDIS_CONNECTION_LOGGERS, WithoutMaintNotice

    async def connect_and_read(stream: io.StringIO) -> str:
        client = aioredis.Redis.from_url(redis_url)
        try:
            await client.ping()
        finally:
            await client.aclose()
        return stream.getvalue()

    raw = io.StringIO()
    configure_logging("DEBUG", "text", stream=raw, force=True)
    filters = [(n, f) for n in REDIS_CONNECTION_LOGGERS for f in logging.getLogger(n).filters]
    for name, f in filters:
        logging.getLogger(name).removeFilter(f)
    try:
        noisy = "maintenance notifications" in await connect_and_read(raw)
    finally:
        for name, f in filters:
            logging.getLogger(name).addFilter(f)
    if not noisy:
        pytest.skip("this Redis server takes CLIENT MAINT_NOTIFICATIONS: no noise to hide")
    assert any(isinstance(f, WithoutMaintNotice) for _, f in filters)
    quiet = io.StringIO()
    configure_logging("DEBUG", "text", stream=quiet, force=True)
    logging.getLogger("aqw.test").debug("still at DEBUG")
    text = await connect_and_read(quiet)
    assert "maintenance notifications" not in text
    assert "still at DEBUG" in text  # only that line is gone


def test_the_stop_summary_says_each_count_once() -> None:
    stats = aqw.WorkerStats(processed=2000, failed=40, retried=40)
    assert stats.summary() == "2000 succeeded, 40 retried"  # each failed attempt was retried
    stats = aqw.WorkerStats(processed=1, failed=3, retried=2, dead=1, requeued=1)
    assert (
        stats.summary()
        == "1 succeeded, 2 retried, 1 dead-lettered, 1 handed back; 3 failed attempts in all"
    )
    assert aqw.WorkerStats().summary() == "0 succeeded"


@pytest.mark.usefixtures("root_logging")
def test_background_lines_are_the_same_lines_written_by_a_thread_in_order() -> None:
    """``aqw`` commands write their lines from a thread of their own: the same text as
    written directly, in the order logged, each with its arguments as they were when logged;
    ``flush_logging`` writes what is queued, and later lines are written directly again."""
    from aqw.cli._logs import Background, Deferred, flush_logging

    direct, queued = io.StringIO(), io.StringIO()
    log = logging.getLogger("aqw.worker")
    fields = {"job_id": "j1", "task": "t", "attempt": 2}

    def lines() -> None:
        for n in range(50):
            log.info("job j1 (t) attempt 2 succeeded in %.1f ms", n / 10, extra=fields)
        items = ["before"]
        log.warning("items %s", items)  # changed after the call: logged as it was
        items.append("after")

    configure_logging("info", "text", stream=direct, force=True)
    lines()
    configure_logging("info", "text", stream=queued, force=True, background=True)
    [handler] = [h for h in logging.getLogger().handlers if h.get_name() == HANDLER_NAME]
    assert isinstance(handler, Deferred)
    assert Background.current is not None and not logging.logThreads  # none shown
    lines()
    flush_logging()
    assert Background.current is None
    strip = re.compile(r"^\S+ \S+ ", re.M)  # the time may differ
    assert strip.sub("", queued.getvalue()) == strip.sub("", direct.getvalue())
    assert queued.getvalue().count("\n") == 51 and "items ['before']" in queued.getvalue()
    assert "job=j1 task=t attempt=2 succeeded in 4.9 ms" in queued.getvalue()
    # flushed: records carry their thread again, and are written directly
    assert logging.logThreads and logging.getLogger().handlers[-1].get_name() == HANDLER_NAME
    log.warning("late")
    assert queued.getvalue().endswith("WARNING aqw.worker late\n")
