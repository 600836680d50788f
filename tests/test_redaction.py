"""Payload contents stay out of error text that outlives a job: worker heartbeats (what
``aqw status --json`` shows) and span events/statuses. ``App(redact_errors=False)`` keeps
the raw text."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Backend
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from pydantic import BaseModel, ValidationError

import aqw
from aqw._redact import MAX_CHARS, redact_error, redact_message, redact_traceback
from aqw.worker._failures import ErrorTracker
from tests._helpers import eventually

pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("error")]

SECRET = "sk_live_51HxSECRETxCARD4242"


class Card(BaseModel):
    number: int
    holder: str


def validation_error(secret: str = SECRET) -> ValidationError:
    try:
        Card.model_validate({"number": secret, "holder": ["not", secret]})
    except ValidationError as exc:
        assert secret in str(exc)  # pydantic's own text repeats the input: the leak
        return exc
    raise AssertionError("no ValidationError")


class Spans:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tp = TracerProvider()
        self.tp.add_span_processor(SimpleSpanProcessor(self.exporter))

    def finished(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def text(self) -> str:
        """Everything the exported spans say: names, attributes, events, statuses."""
        out: list[str] = []
        for span in self.finished():
            out += [span.name, str(span.status.description), repr(dict(span.attributes or {}))]
            for event in span.events:
                out += [event.name, repr(dict(event.attributes or {}))]
        return "\n".join(out)

    def named(self, name: str) -> ReadableSpan:
        (span,) = [s for s in self.finished() if s.name == name]
        return span


@pytest.fixture
def spans() -> Iterator[Spans]:
    s = Spans()
    try:
        yield s
    finally:
        s.tp.shutdown()


# -- the redaction function --------------------------------------------------------------------


def test_a_validation_error_keeps_locations_and_messages_not_inputs() -> None:
    exc = validation_error()
    text = redact_error(exc)
    assert SECRET not in text and "input" not in text
    assert text.startswith("ValidationError: number: Input should be a valid integer")
    assert "holder: Input should be a valid string" in text
    assert redact_message(exc) == text.removeprefix("ValidationError: ")
    assert "\n" not in text and len(text) <= MAX_CHARS


def test_many_validation_errors_are_summed_up() -> None:
    class Wide(BaseModel):
        a: int
        b: int
        c: int
        d: int
        e: int
        f: int
        g: int

    try:
        Wide.model_validate({k: SECRET for k in "abcdefg"})
    except ValidationError as exc:
        text = redact_error(exc, limit=2_000)
    assert SECRET not in text
    assert text.count("Input should be a valid integer") == 5
    assert text.endswith("; ... and 2 more")


def test_other_errors_keep_type_and_message_on_one_capped_line() -> None:
    assert redact_error(ValueError("boom")) == "ValueError: boom"
    assert redact_message(ValueError("boom")) == "boom"
    assert redact_error(KeyError("k")) == "KeyError: 'k'"
    assert redact_error(RuntimeError()) == "RuntimeError"
    text = redact_error(ValueError("line one\nline two\r\x1b[31mred\u2028\x00end"))
    assert text == "ValueError: line one\\nline two\\r\\x1b[31mred\\u2028\\x00end"
    long = redact_error(ValueError("y" * 10_000))
    assert len(long) == MAX_CHARS and long.startswith("ValueError: yyy")
    escaped = redact_error(ValueError("\n" * 10_000))
    assert len(escaped) <= MAX_CHARS and escaped.endswith("\\n")
    assert len(redact_message(ValueError("z" * 900), 500)) == 500


def test_an_error_whose_str_raises_is_still_described() -> None:
    class Broken(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert redact_error(Broken()) == "Broken: <unprintable message>"


def test_the_redacted_traceback_keeps_frames_and_chains_without_inputs() -> None:
    def parse() -> None:
        Card.model_validate({"number": SECRET, "holder": "h"})

    try:
        try:
            parse()
        except ValidationError as exc:
            raise LookupError("card could not be read") from exc
    except LookupError as outer:
        text = redact_traceback(outer)
    assert SECRET not in text
    assert text.count("Traceback (most recent call last):") == 2
    assert "in parse" in text  # the frames are kept
    assert "The above exception was the direct cause of the following exception" in text
    assert "ValidationError: number: Input should be a valid integer" in text
    assert text.endswith("LookupError: card could not be read\n")


# -- heartbeats ------------------------------------------------------------------------------------


def test_the_error_tracker_keeps_no_input_values_unless_told() -> None:
    tracker = ErrorTracker()
    tracker.record(validation_error(), "charge")
    (top,) = tracker.top()
    assert top.error_type == "ValidationError"
    assert SECRET not in top.message
    assert top.message.startswith("number: Input should be a valid integer")
    raw = ErrorTracker(redact=False)
    raw.record(validation_error(), "charge")
    assert SECRET in raw.top()[0].message  # today's raw text, cut to 500 characters
    multi = ErrorTracker()
    multi.record(ValueError("first\nsecond"), "t")
    assert multi.top()[0].message == "first\\nsecond"


async def test_a_workers_heartbeat_shows_no_payload_values(backend: Backend) -> None:
    app = backend.app()

    @app.task(name="charge", max_retries=0)
    async def charge(card_id: str) -> None:
        Card.model_validate({"number": SECRET, "holder": card_id})

    await charge.enqueue("c-1")
    async with app.worker(concurrency=1, heartbeat=0.05) as worker:
        await eventually(lambda: worker.stats.dead == 1, 10, "the job dead-lettered")

        async def published() -> list[dict[str, Any]]:
            beats = await app.broker.status.heartbeats()
            return [b for b in beats if b.get("worker") == worker.name and b.get("errors")]

        await eventually(published, 10, "a heartbeat with the error")
        beats = await published()
    (error,) = beats[-1]["errors"]
    assert error["error_type"] == "ValidationError" and error["task"] == "charge"
    assert error["message"].startswith("number: Input should be a valid integer")
    assert SECRET not in json.dumps(beats)
    assert SECRET not in json.dumps(worker.summary())


async def test_a_workers_heartbeat_keeps_the_raw_text_when_redaction_is_off(
    backend: Backend,
) -> None:
    app = backend.app(redact_errors=False)

    @app.task(name="charge", max_retries=0)
    async def charge(card_id: str) -> None:
        Card.model_validate({"number": SECRET, "holder": card_id})

    await charge.enqueue("c-1")
    async with app.worker(concurrency=1) as worker:
        await eventually(lambda: worker.stats.dead == 1, 10, "the job dead-lettered")
    assert SECRET in json.dumps(worker.summary()["errors"])


# -- spans -----------------------------------------------------------------------------------------


async def run_failing_charge(app: aqw.App, spans: Spans, at_least: int) -> None:
    """Run one job whose handler fails validating a card that holds ``SECRET``, until it is
    dead-lettered and at least ``at_least`` spans have finished."""

    @app.task(name="charge", max_retries=0)
    async def charge(card_id: str) -> None:
        Card.model_validate({"number": SECRET, "holder": card_id})

    await charge.enqueue("c-1")
    async with app.worker(concurrency=1) as worker:
        await eventually(lambda: worker.stats.dead == 1, 10, "the job dead-lettered")
    await eventually(lambda: len(spans.finished()) >= at_least, 5, "the job's spans")


async def test_the_one_span_of_a_failed_job_carries_no_payload_values(spans: Spans) -> None:
    app = aqw.App("memory://redact-one-span", tracer_provider=spans.tp)  # the default detail
    await run_failing_charge(app, spans, at_least=2)
    process = spans.named("process redact-one-span")
    assert process.status.status_code is StatusCode.ERROR
    exceptions = [e for e in process.events if e.name == "exception"]
    assert len(exceptions) == 1
    for span in spans.finished():
        texts = [str(span.status.description), str(dict(span.attributes or {}))]
        texts += [str(dict(e.attributes or {})) for e in span.events]
        assert all(SECRET not in text for text in texts), span.name
    await app.close()


async def test_spans_of_a_failed_job_carry_no_payload_values(spans: Spans) -> None:
    app = aqw.App(
        "memory://redact-spans", tracer_provider=spans.tp, trace_detail="stages"
    )  # a child span per stage: the handler's is checked too
    await run_failing_charge(app, spans, at_least=5)
    handler = spans.named("aqw.handler")
    assert handler.status.status_code is StatusCode.ERROR
    (event,) = handler.events
    assert event.name == "exception"
    attrs = dict(event.attributes or {})
    assert attrs["exception.type"] == "pydantic_core._pydantic_core.ValidationError"
    assert str(attrs["exception.message"]).startswith("number: Input should be a valid integer")
    assert "Traceback" in str(attrs["exception.stacktrace"])
    process = spans.named("process redact-spans")
    assert process.status.status_code is StatusCode.ERROR
    assert SECRET not in spans.text()
    await app.close()


async def test_spans_keep_the_raw_text_when_redaction_is_off(spans: Spans) -> None:
    app = aqw.App(
        "memory://raw-spans", tracer_provider=spans.tp, redact_errors=False, trace_detail="stages"
    )
    await run_failing_charge(app, spans, at_least=5)
    process = spans.named("process raw-spans")
    assert SECRET in str(process.status.description)
    (event,) = process.events
    assert SECRET in str(dict(event.attributes or {})["exception.message"])
    await app.close()


@pytest.mark.parametrize("redact", [True, False])
def test_an_error_escaping_the_handler_span_is_recorded_redacted(
    spans: Spans, redact: bool
) -> None:
    tel = aqw.Telemetry("q", "memory", tracer_provider=spans.tp, redact=redact, detail="stages")
    jt = tel.job(aqw.Job(task="t"))
    exc = validation_error()
    with pytest.raises(ValidationError), jt.handler():
        raise exc
    jt.end(exc)
    for name in ("aqw.handler", "process q"):
        span = spans.named(name)
        assert span.status.status_code is StatusCode.ERROR
        (event,) = span.events  # one exception event: the SDK's own recording is off
        attrs = dict(event.attributes or {})
        texts = [span.status.description, attrs["exception.message"], attrs["exception.stacktrace"]]
        for text in texts:
            assert (SECRET in str(text)) is not redact, (name, text)
        if redact:
            assert span.status.description == redact_error(exc)
            assert attrs["exception.message"] == redact_message(exc)
            assert "in test_an_error_escaping_the_handler_span" in str(
                attrs["exception.stacktrace"]
            )


def test_record_error_is_a_no_op_on_a_span_not_recording() -> None:
    from opentelemetry.trace import INVALID_SPAN

    aqw.Telemetry("q", "memory").record_error(INVALID_SPAN, validation_error(), status=True)


async def test_a_refused_enqueue_marks_its_publish_span(spans: Spans) -> None:
    app = aqw.App("memory://refused", tracer_provider=spans.tp, max_payload_bytes=500)

    @app.task(name="upload")
    async def upload(data: str) -> None:
        pass

    with pytest.raises(aqw.PayloadTooLarge):
        await upload.enqueue("x" * 1_000)
    publish = spans.named("publish refused")
    assert publish.status.status_code is StatusCode.ERROR
    assert str(publish.status.description).startswith("PayloadTooLarge: task 'upload'")
    assert "x" * 100 not in spans.text()
    await app.close()


AQW_DIR = str(Path(aqw.__file__).resolve().parent)


@pytest.mark.parametrize("redact", [True, False])
async def test_a_handlers_traceback_starts_at_the_users_code(redact: bool) -> None:
    app = aqw.App("memory://", queue=f"tb-{redact}", redact_errors=redact)

    @app.task(name="boom", max_retries=0)
    async def boom(n: int) -> None:
        raise ValueError("bad row")

    await boom.enqueue(1)
    async with app.worker(burst=True) as worker:
        await asyncio.wait_for(worker.wait_stopped(), 10)
    [dead] = await app.dlq.list()
    assert "in boom" in dead.traceback, dead.traceback
    assert "ValueError" in dead.traceback
    aqw_dir = AQW_DIR
    assert aqw_dir not in dead.traceback, dead.traceback  # the worker's frames are left out
    await app.close()
