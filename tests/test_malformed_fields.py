"""Every header and envelope field malformed in turn: nothing escapes the job path.

Each case writes one raw message (a stream entry written with XADD, field ``j``, as a foreign
or buggy producer would; raw bytes on the memory broker) for a task that raises on every
valid payload, with max_retries=3. Whatever the damage, the message ends in the dead-letter
queue with a non-empty reason within its retry bound (at most 4 handler runs), and nothing
stays pending: the stream and the pending list are empty, nothing is delayed.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from conftest import Backend

import aqw
from aqw.brokers.redis import RedisBroker
from tests._helpers import depth, eventually, publish_raw

pytestmark = pytest.mark.timeout(30)

FAST = aqw.RetryPolicy(max_retries=3, base=0.01, cap=0.02)
MAX_RUNS = FAST.max_retries + 1


def envelope(**changes: Any) -> dict[str, Any]:
    """A valid envelope for task ``work`` (payload 7), with ``changes`` applied."""
    fields: dict[str, Any] = json.loads(aqw.Job(task="work", payload=7).encode())
    fields.update(changes)
    return fields


def encoded(**changes: Any) -> bytes:
    return json.dumps(envelope(**changes)).encode()


def raw_number(field: str, literal: str) -> bytes:
    """The envelope with ``field`` set to a JSON number literal json.dumps cannot write."""
    body = envelope(**{field: 12345.5})
    text = json.dumps(body).replace(f'"{field}": 12345.5', f'"{field}": {literal}')
    assert literal in text
    return text.encode()


FF = "aqw-first-failure"

#: case name -> the stream entry's fields
CASES: dict[str, dict[str, bytes]] = {
    # the first-failure header, read leniently on every retry and dead-letter
    "first-failure abc": {"j": encoded(headers={FF: "abc"})},
    "first-failure nan": {"j": encoded(headers={FF: "nan"})},
    "first-failure 1e400": {"j": encoded(headers={FF: "1e400"})},
    "first-failure -inf": {"j": encoded(headers={FF: "-inf"})},
    "first-failure negative": {"j": encoded(headers={FF: "-5"})},
    "first-failure 1e300": {"j": encoded(headers={FF: "1e300"})},
    "first-failure empty": {"j": encoded(headers={FF: ""})},
    "first-failure 10 KB": {"j": encoded(headers={FF: "9" * 10_000})},
    "first-failure a number": {"j": encoded(headers={FF: 123})},
    "first-failure null": {"j": encoded(headers={FF: None})},
    "first-failure a list": {"j": encoded(headers={FF: ["1"]})},
    # attempt
    "attempt 0": {"j": encoded(attempt=0)},
    "attempt -1": {"j": encoded(attempt=-1)},
    "attempt x": {"j": encoded(attempt="x")},
    "attempt 10**30": {"j": encoded(attempt=10**30)},
    "attempt 2**63-1": {"j": encoded(attempt=2**63 - 1)},
    "attempt 1.5": {"j": encoded(attempt=1.5)},
    "attempt null": {"j": encoded(attempt=None)},
    # id
    "id empty": {"j": encoded(id="")},
    "id 10 KB": {"j": encoded(id="i" * 10_240)},
    "id a number": {"j": encoded(id=5)},
    "id with braces and newlines": {"j": encoded(id="}{\n\r x")},
    # task
    "task unknown": {"j": encoded(task="no-such-task")},
    "task empty": {"j": encoded(task="")},
    "task a list": {"j": encoded(task=["work"])},
    # payload
    "payload a string": {"j": encoded(payload="seven")},
    "payload an object": {"j": encoded(payload={"n": 7})},
    "payload missing": {
        "j": json.dumps({k: v for k, v in envelope().items() if k != "payload"}).encode()
    },
    # enqueued_at
    "enqueued_at x": {"j": encoded(enqueued_at="x")},
    "enqueued_at Infinity": {"j": raw_number("enqueued_at", "Infinity")},
    "enqueued_at NaN": {"j": raw_number("enqueued_at", "NaN")},
    "enqueued_at 1e400": {"j": raw_number("enqueued_at", "1e400")},
    "enqueued_at -1e300": {"j": encoded(enqueued_at=-1e300)},
    "enqueued_at string Infinity": {"j": encoded(enqueued_at="Infinity")},
    # headers
    "headers a list": {"j": encoded(headers=["traceparent", "x"])},
    "headers a string": {"j": encoded(headers="h")},
    "headers a junk traceparent": {"j": encoded(headers={"traceparent": "00-zz-yy-01"})},
    # key
    "key 5 KB": {"j": encoded(key="k" * 5_120)},
    "key a number": {"j": encoded(key=5)},
    # the whole message
    "non-UTF-8 bytes": {"j": b'{"task": "work", "payload": 7, "id": "\xff\xfe"}'},
    "non-UTF-8 garbage": {"j": b"\xff\xfe\xfd\x00\x80"},
    "not JSON": {"j": b"{not json"},
    "JSON null": {"j": b"null"},
    "JSON array": {"j": b"[1, 2]"},
    "empty": {"j": b""},
    "version 2": {"j": encoded(v=2)},
    "entry without j": {"job": encoded()},
    "entry with j and junk fields": {"j": encoded(), "zz": b"\xff"},
}

#: Cases a stream entry can carry but the memory broker's raw bytes cannot.
STREAM_ONLY = {"entry without j", "entry with j and junk fields"}


def test_every_case_is_distinct_and_the_undamaged_envelope_is_valid() -> None:
    assert aqw.Job.decode(encoded()).payload == 7
    bodies = [tuple(sorted(fields.items())) for fields in CASES.values()]
    assert len(set(bodies)) == len(bodies)


def accepted_attempt(fields: dict[str, bytes]) -> int | None:
    """The attempt of a case's message when the worker accepts it as a runnable job of
    ``work`` (it decodes and its payload validates), else None."""
    try:
        job = aqw.Job.decode(fields["j"])
    except (KeyError, aqw.MalformedJob):
        return None
    if job.task != "work" or not isinstance(job.payload, int) or isinstance(job.payload, bool):
        return None
    return job.attempt


ACCEPTED = {name: a for name, fields in CASES.items() if (a := accepted_attempt(fields))}


async def run_case(backend: Backend, case: str) -> tuple[aqw.Worker, Counter[str], Any]:
    """Publish the case's message, run a worker until it is settled and nothing is left
    pending; (the worker, handler runs by job id, the one DLQ entry)."""
    if case in STREAM_ONLY and not backend.is_redis:
        pytest.skip("the memory broker carries only the message bytes")
    app = backend.app(retry=FAST, lease_ttl=2.0)
    runs: Counter[str] = Counter()

    @app.task(name="work")
    async def work(n: int, ctx: aqw.Context) -> None:
        runs[ctx.job_id] += 1
        raise RuntimeError(f"work {n} fails, attempt {ctx.attempt}")

    await app.broker.connect()
    await publish_raw(backend, app, CASES[case])
    async with app.worker(concurrency=4) as worker:
        await eventually(
            lambda: worker.stats.dead + worker.stats.processed >= 1,
            10,
            f"{case}: the message to settle",
        )
        await eventually(lambda: _drained(backend, app), 5, f"{case}: nothing left pending")
    s = worker.stats
    assert (s.processed, s.dead) == (0, 1), f"{case}: {s}"
    assert sum(runs.values()) <= MAX_RUNS, f"{case}: the handler ran {dict(runs)} times"
    assert len(runs) <= 1, f"{case}: {dict(runs)}"
    assert s.retried <= FAST.max_retries, f"{case}: {s}"
    dead = await app.dlq.list(limit=10)
    assert len(dead) == 1, f"{case}: {dead}"
    entry = dead[0]
    assert entry.error.strip(), f"{case}: an empty reason"
    assert entry.error_type.strip(), f"{case}: an empty error type"
    assert await depth(app) == (0, 0, 0, 1), case
    return worker, runs, entry


@pytest.mark.parametrize("case", list(CASES))
async def test_a_malformed_message_ends_in_the_dlq_within_its_retry_bound(
    backend: Backend, case: str
) -> None:
    await run_case(backend, case)


@pytest.mark.parametrize("case", list(ACCEPTED))
async def test_an_accepted_message_keeps_its_own_failure_through_its_retries(
    backend: Backend, case: str
) -> None:
    """A message the worker accepted and ran is retried as the same job until its bound and
    dead-lettered with the handler's own error, in a DLQ record its reader takes as is:
    the worker's rewrites of the envelope (attempt + 1, the first-failure header) must not
    turn a job it accepted into one it refuses."""
    attempt = ACCEPTED[case]
    _, runs, entry = await run_case(backend, case)
    expected_runs = max(1, FAST.max_retries + 2 - attempt)
    assert sum(runs.values()) == expected_runs, f"{case}: ran {dict(runs)}"
    assert entry.error_type == "RuntimeError", (
        f"{case}: the handler failed, but the DLQ says {entry.error_type}: {entry.error}"
    )
    damaged = getattr(entry, "damaged", ())
    assert not damaged, f"{case}: the worker wrote a DLQ record its reader calls damaged"
    assert entry.attempts == max(attempt, FAST.max_retries + 1), f"{case}: {entry}"
    job = entry.job
    assert job is not None, f"{case}: the DLQ record's message no longer decodes"


async def _drained(backend: Backend, app: aqw.App) -> bool:
    if await depth(app) != (0, 0, 0, 1):
        return False
    if backend.raw is None:
        return True
    broker = app.broker
    assert isinstance(broker, RedisBroker)
    summary: Any = await backend.raw.xpending(broker.keys.stream, "aqw")
    return (
        int(summary["pending"]) == 0
        and await backend.raw.xlen(broker.keys.stream) == 0
        and await backend.raw.zcard(broker.keys.delayed) == 0
    )
