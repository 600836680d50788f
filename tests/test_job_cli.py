"""``aqw job show|wait|cancel``, ``aqw status JOB_ID`` and ``aqw dlq show JOB_ID``, run in-process
(``aqw.cli._main.run_command``: the command line's parser, exit status and error lines, in the
test's event loop) against the in-process broker and the real Redis.

The jobs' states are made with the broker's own steps, as a worker takes them (publish, fetch,
the job's lease from ``job_lease_backend``, then ack / dead_letter / cancel), plus one real
worker run per backend for a task that keeps its result and one that dead-letters. The CLI
targets the queue as an operator would, with ``--broker`` and ``--queue``: a broker of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import traceback
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest
from conftest import REDIS_URL, Backend, open_backend

import aqw
from aqw.brokers.base import Broker, Delivery, Failure, Finish
from aqw.cli._main import run_command
from aqw.record import JobInfo
from aqw.status import RESULT_SHOWN, render_job
from aqw.worker import Worker
from tests._helpers import free_port

pytestmark = pytest.mark.timeout(30)

KINDS = ["memory", pytest.param("redis", marks=pytest.mark.redis)]


# -- fixtures -----------------------------------------------------------------------------------


@dataclass
class Ran:
    """What one command did: its exit status and what it wrote."""

    status: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        return json.loads(self.out)


class Kit:
    """A queue on one backend: the broker steps that put jobs in each state, and the CLI."""

    def __init__(self, backend: Backend, capsys: pytest.CaptureFixture[str]) -> None:
        self.backend = backend
        self.capsys = capsys
        self.broker: Broker = backend.broker()
        url = REDIS_URL if backend.kind == "redis" else "memory://"
        self.target = ["--broker", url, "--queue", backend.queue]
        #: What the commands of the hints carry to reach the same queue when pasted.
        self.pasted = " ".join(self.target)

    async def __call__(self, *argv: str, target: bool = True) -> Ran:
        self.capsys.readouterr()  # drop what came before
        status = await run_command([*argv, *(self.target if target else [])])
        got = self.capsys.readouterr()
        return Ran(status, got.out, got.err)

    # -- jobs in each state, through the broker's own steps

    async def queued(self, n: int = 1, **fields: Any) -> aqw.Job:
        job = aqw.Job(task="work", payload={"n": n}, **fields)
        await self.broker.publish([job])
        return job

    async def delayed(self, seconds: float = 3600) -> aqw.Job:
        job = aqw.Job(task="work", payload={"n": 0})
        await self.broker.schedule([job], time.time() + seconds)
        return job

    async def running(self, n: int = 1, ttl: float = 30) -> tuple[Delivery, aqw.Job, aqw.Lease]:
        """Publish a job, fetch it and take its lease, as a worker starts it (the queue holds
        no other waiting job)."""
        job = await self.queued(n)
        [delivery] = await self.broker.fetch(1, 1.0)
        assert aqw.Job.decode(delivery.data).id == job.id
        lease = aqw.Lease(
            self.broker.job_lease_backend(job), self.broker.job_lease_key(job), ttl=ttl
        )
        await lease.acquire()
        return delivery, job, lease

    async def finished(self, finish: Finish, n: int = 1) -> aqw.Job:
        delivery, job, lease = await self.running(n)
        lease.hand_over()
        assert await self.broker.ack(delivery, job, lease, finish=finish)
        return job

    async def dead(self, n: int = 1) -> tuple[aqw.Job, str]:
        delivery, job, lease = await self.running(n)
        lease.hand_over()
        entry = await self.broker.dead_letter(delivery, job, failure(n), 3, lease)
        assert entry is not None
        return job, entry


def failure(n: int = 1) -> Failure:
    try:
        raise ValueError(f"bad value {n}")
    except ValueError as exc:
        tb = "".join(traceback.format_exception(exc))
    now = time.time()
    return Failure(
        error_type="ValueError",
        error=f"ValueError: bad value {n}",
        traceback=tb,
        worker="w-1",
        first_failed_at=now - 5,
        failed_at=now,
        fingerprint="f1a2b3",
    )


@contextlib.asynccontextmanager
async def open_kit(kind: str, queue: str, capsys: pytest.CaptureFixture[str]) -> AsyncIterator[Kit]:
    async with open_backend(kind, queue) as backend:
        k = Kit(backend, capsys)
        await k.broker.connect()
        await k.broker.start_consuming("w-1")
        try:
            yield k
        finally:
            await k.broker.close()


@pytest.fixture(params=KINDS)
async def kit(
    request: pytest.FixtureRequest, queue_name: str, capsys: pytest.CaptureFixture[str]
) -> AsyncIterator[Kit]:
    async with open_kit(request.param, queue_name, capsys) as k:
        yield k


@pytest.fixture
async def redis_kit(queue_name: str, capsys: pytest.CaptureFixture[str]) -> AsyncIterator[Kit]:
    async with open_kit("redis", queue_name, capsys) as k:
        yield k


def rows(text: str) -> dict[str, str]:
    """The ``  name   value`` lines of the human view, by name."""
    out: dict[str, str] = {}
    for line in text.splitlines()[1:]:
        if line.startswith("  ") and not line.startswith("    ") and "  " in line.strip():
            name, _, value = line.strip().partition("  ")
            out[name] = value.strip()
    return out


# -- aqw job show ---------------------------------------------------------------------------------


async def test_show_a_queued_job_human_and_json(kit: Kit) -> None:
    job = await kit.queued(7, key="import:7")
    ran = await kit("job", "show", job.id)
    assert ran.status == 0, ran.err
    assert ran.out.startswith(f"job {job.id}: queued\n")
    shown = rows(ran.out)
    assert shown["queue"] == kit.backend.queue
    assert shown["task"] == "work"
    assert shown["attempts"] == "0"
    assert shown["enqueued"].endswith("ago)") and " UTC (" in shown["enqueued"]
    assert shown["started"] == shown["finished"] == shown["worker"] == "-"
    assert shown["key"] == "import:7"
    assert shown["cancel requested"] == "no"

    ran = await kit("job", "show", job.id, "--json")
    assert ran.status == 0, ran.err
    record = ran.json
    assert record == JobInfo.model_validate(record).model_dump(mode="json")
    assert (record["id"], record["state"], record["task"]) == (job.id, "queued", "work")
    assert record["queue"] == kit.backend.queue
    assert datetime.fromisoformat(record["enqueued_at"]).timestamp() == pytest.approx(
        job.enqueued_at, abs=1e-3
    )


async def test_show_a_delayed_job_says_when_it_runs(kit: Kit) -> None:
    job = await kit.delayed(3600)
    ran = await kit("job", "show", job.id)
    assert ran.status == 0, ran.err
    assert ran.out.startswith(f"job {job.id}: delayed\n")
    assert "(in 59m" in rows(ran.out)["run at"]


async def test_show_a_succeeded_job_with_its_result(kit: Kit) -> None:
    result = {"total": 42, "items": ["a", "b"]}
    job = await kit.finished(Finish(result=json.dumps(result)))
    ran = await kit("job", "show", job.id)
    assert ran.status == 0, ran.err
    assert ran.out.startswith(f"job {job.id}: succeeded\n")
    shown = rows(ran.out)
    assert shown["attempts"] == "1" and shown["worker"] == "w-1"
    assert shown["finished"] != "-" and shown["started"] != "-"
    assert shown["fencing token"].isdigit()
    # the result as indented JSON lines, under "result:"
    block = ran.out.split("  result:\n", 1)[1]
    assert json.loads("\n".join(line[4:] for line in block.splitlines())) == result
    record = (await kit("job", "show", job.id, "--json")).json
    assert (record["state"], record["has_result"], record["result"]) == ("succeeded", True, result)


async def test_a_big_result_is_cut_in_the_human_view_only(kit: Kit) -> None:
    result = ["x" * 100] * 100  # ~10 KB of JSON
    job = await kit.finished(Finish(result=json.dumps(result)))
    ran = await kit("job", "show", job.id)
    assert ran.status == 0, ran.err
    assert f"... cut at {RESULT_SHOWN} characters of" in ran.out
    assert len(ran.out) < RESULT_SHOWN + 3000
    assert (await kit("job", "show", job.id, "--json")).json["result"] == result


async def test_a_result_not_kept_says_why(kit: Kit) -> None:
    job = await kit.finished(Finish(note="too big: 2000000 bytes over max_result_bytes"))
    ran = await kit("job", "show", job.id)
    assert rows(ran.out)["result"] == "not kept: too big: 2000000 bytes over max_result_bytes"
    ran = await kit("job", "wait", job.id)
    assert (ran.status, ran.out) == (
        0,
        f"job {job.id}: succeeded; its result was not kept: too big: 2000000 bytes over "
        "max_result_bytes\n",
    )


async def test_show_a_dead_job_names_its_dlq_entry(kit: Kit) -> None:
    job, entry = await kit.dead(5)
    ran = await kit("job", "show", job.id)
    assert ran.status == 0, ran.err
    assert ran.out.startswith(f"job {job.id}: dead\n")
    shown = rows(ran.out)
    assert shown["error type"] == "ValueError"
    assert shown["error"] == "ValueError: bad value 5"
    assert shown["fingerprint"] == "f1a2b3"
    assert shown["dlq entry"] == f"{entry}  (aqw dlq show {entry} {kit.pasted})"
    tb = ran.out.split("  traceback:\n", 1)[1].splitlines()
    assert tb[0] == "    Traceback (most recent call last):"
    assert tb[-1] == "    ValueError: bad value 5"
    record = (await kit("job", "show", job.id, "--json")).json
    assert record["dlq_entry"] == entry
    assert record["error"]["type"] == "ValueError"


async def test_show_a_cancelled_job(kit: Kit) -> None:
    job = await kit.queued()
    assert await kit.broker.records.cancel(job.id) == "cancelled"
    ran = await kit("job", "show", job.id)
    assert ran.status == 0, ran.err
    assert ran.out.startswith(f"job {job.id}: cancelled\n")
    assert rows(ran.out)["cancel requested"] == "yes"
    assert rows(ran.out)["finished"] != "-"


async def test_show_a_running_job(kit: Kit) -> None:
    _, job, lease = await kit.running()
    ran = await kit("job", "show", job.id)
    assert ran.out.startswith(f"job {job.id}: running\n")
    shown = rows(ran.out)
    assert shown["worker"] == "w-1"
    assert shown["fencing token"] == str(lease.fencing_token)
    assert "(in " in shown["lease expires"]
    await lease.release()


async def test_show_and_status_of_an_unknown_job_exit_6(kit: Kit) -> None:
    for argv in (["job", "show", "nope"], ["status", "nope"], ["job", "show", "nope", "--json"]):
        ran = await kit(*argv)
        assert ran.status == 6, (argv, ran)
        assert ran.out == ""
        [line] = ran.err.splitlines()
        assert line.startswith("aqw: error: no record of job 'nope'"), line


async def test_status_job_id_shows_the_record(kit: Kit) -> None:
    job, entry = await kit.dead(2)
    ran = await kit("status", job.id)
    show = await kit("job", "show", job.id)
    assert ran.status == show.status == 0, ran.err
    assert ran.out.startswith(f"job {job.id}: dead\n")
    assert ran.out.splitlines()[0] == show.out.splitlines()[0]
    assert list(rows(ran.out)) == list(rows(show.out))
    assert rows(ran.out)["dlq entry"] == f"{entry}  (aqw dlq show {entry} {kit.pasted})"
    assert (await kit("status", job.id, "--json")).json["dlq_entry"] == entry


# -- aqw job wait ---------------------------------------------------------------------------------


async def test_wait_exit_status_by_outcome(kit: Kit) -> None:
    ok = await kit.finished(Finish(result=json.dumps({"ok": True})))
    failed = await kit.finished(Finish(state="failed", failure=failure(9)))
    dead, entry = await kit.dead(4)
    expired = await kit.finished(Finish(state="expired"))
    cancelled = await kit.queued()
    assert await kit.broker.records.cancel(cancelled.id) == "cancelled"

    ran = await kit("job", "wait", ok.id)
    assert ran.status == 0, ran.err
    first, *rest = ran.out.splitlines()
    assert first == f"job {ok.id}: succeeded"
    assert json.loads("\n".join(rest)) == {"ok": True}

    ran = await kit("job", "wait", failed.id, "--timeout", "5")
    assert (ran.status, ran.out) == (3, f"job {failed.id}: failed: ValueError: bad value 9\n")
    ran = await kit("job", "wait", dead.id)
    assert ran.status == 3
    assert ran.out == (
        f"job {dead.id}: dead: ValueError: bad value 4 "
        f"(dlq entry {entry}: aqw dlq show {entry} {kit.pasted})\n"
    )
    ran = await kit("job", "wait", cancelled.id)
    assert (ran.status, ran.out) == (4, f"job {cancelled.id}: cancelled\n")
    ran = await kit("job", "wait", expired.id)
    assert (ran.status, ran.out) == (5, f"job {expired.id}: expired\n")
    ran = await kit("job", "wait", dead.id, "--json")
    assert ran.status == 3 and ran.json["state"] == "dead"


async def test_wait_returns_when_the_job_ends(kit: Kit) -> None:
    delivery, job, lease = await kit.running()
    waiting = asyncio.create_task(kit("job", "wait", job.id, "--timeout", "10"))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    lease.hand_over()
    assert await kit.broker.ack(delivery, job, lease, finish=Finish(result="[1, 2]"))
    ran = await asyncio.wait_for(waiting, 5)
    assert ran.status == 0, ran.err
    assert ran.out.splitlines()[0] == f"job {job.id}: succeeded"


async def test_wait_times_out_with_124_and_unknown_is_6(kit: Kit) -> None:
    job = await kit.queued()
    timeout = 0.3
    started = time.monotonic()
    ran = await kit("job", "wait", job.id, "--timeout", str(timeout))
    assert time.monotonic() - started >= timeout  # it waited its timeout, then gave up
    assert (ran.status, ran.out) == (124, "")
    assert ran.err == f"aqw: error: job {job.id} has not ended after 0.3s (it is queued)\n"

    ran = await kit("job", "wait", "nope", "--timeout", "1")
    assert ran.status == 6 and ran.out == ""
    assert ran.err.startswith("aqw: error: no record of job 'nope'")


@pytest.mark.parametrize("bad", ["0", "-1", "soon", "nan", "inf"])
async def test_a_bad_timeout_is_a_one_line_usage_error(kit: Kit, bad: str) -> None:
    ran = await kit("job", "wait", "some-id", "--timeout", bad)
    assert ran.status == 2 and ran.out == ""
    [line] = ran.err.splitlines()
    assert line.startswith("aqw job wait: error: argument --timeout:"), line


# -- aqw job cancel -------------------------------------------------------------------------------


async def test_cancel_outcomes(kit: Kit) -> None:
    _, running, lease = await kit.running()
    done = await kit.finished(Finish(), n=2)
    queued = await kit.queued(3)

    ran = await kit("job", "cancel", queued.id)
    assert (ran.status, ran.out) == (0, "cancelled: it had not started and will not run\n")
    assert (await kit.broker.records.record(queued.id)) is not None
    assert (await kit("job", "show", queued.id, "--json")).json["state"] == "cancelled"

    ran = await kit("job", "cancel", running.id)
    assert ran.status == 0
    assert ran.out == (
        "cancelling: its worker is told now and stops the handler within about a second "
        "(at its next lease renewal, within ttl/3 = 10s, if the word does not reach it)\n"
    )
    assert await kit.broker.records.cancel_requested(running.id)

    ran = await kit("job", "cancel", done.id)
    assert (ran.status, ran.out) == (0, "already finished (succeeded); nothing to cancel\n")
    ran = await kit("job", "cancel", queued.id)  # cancelled is final too
    assert (ran.status, ran.out) == (0, "already finished (cancelled); nothing to cancel\n")

    ran = await kit("job", "cancel", "nope")
    assert ran.status == 6 and ran.out == ""
    assert ran.err.startswith("aqw: error: no record of job 'nope'")
    await lease.release()


# -- aqw dlq show by entry id or job id -----------------------------------------------------------


async def test_dlq_show_by_entry_id_or_job_id(kit: Kit) -> None:
    job, entry = await kit.dead(6)
    by_entry = await kit("dlq", "show", entry)
    by_job = await kit("dlq", "show", job.id)
    assert by_entry.status == by_job.status == 0, (by_entry.err, by_job.err)
    ago = re.compile(r"\(\d+(\.\d)?s ago\)")  # read a moment apart: "5.0s ago", "5.1s ago"
    assert ago.sub("(ago)", by_entry.out) == ago.sub("(ago)", by_job.out)
    out = by_entry.out
    assert out.startswith(f"dead job {entry}\n")
    shown = rows(out)
    assert shown["job"] == job.id and shown["task"] == "work"
    assert shown["error"] == "ValueError: bad value 6" and shown["attempts"] == "3"
    assert " UTC (" in shown["first failed"] and shown["last failed"].endswith("ago)")
    assert shown["replay"] == f"aqw dlq replay {entry} {kit.pasted}"
    assert "    Traceback (most recent call last):" in out.splitlines()
    # the envelope once, as indented JSON
    envelope = out.split("  envelope:\n", 1)[1]
    assert json.loads("\n".join(line[4:] for line in envelope.splitlines()))["id"] == job.id
    assert out.count('"payload"') == 1

    as_json = (await kit("dlq", "show", job.id, "--json")).json
    assert (as_json["id"], as_json["job_id"], as_json["job"]["payload"]) == (
        entry,
        job.id,
        {"n": 6},
    )


async def test_dlq_show_of_a_job_that_is_not_dead_says_so(kit: Kit) -> None:
    job = await kit.queued()
    ran = await kit("dlq", "show", job.id)
    assert ran.status == 2
    [line] = ran.err.splitlines()
    assert line == (
        f"aqw: error: no dead job with id {job.id!r}: job {job.id!r} is queued, not dead-lettered"
    )
    ran = await kit("dlq", "show", "no-such-thing")
    assert ran.status == 2
    assert ran.err.startswith("aqw: error: no dead job with id 'no-such-thing': no entry")


async def test_dlq_list_has_a_job_column(kit: Kit) -> None:
    job, entry = await kit.dead(1)
    ran = await kit("dlq", "list")
    header, row = ran.out.splitlines()
    assert header.split()[:5] == ["ID", "JOB", "TASK", "ERROR", "ATT"]
    assert row.split()[:5] == [entry, job.id, "work", "ValueError", "3"]


# -- a real worker run ----------------------------------------------------------------------------


async def test_a_worker_run_keeps_the_result_and_dead_letters(kit: Kit) -> None:
    app = aqw.App(kit.backend.broker(), retry=aqw.RetryPolicy(max_retries=0))

    @app.task(name="add", keep_result=True)
    async def add(a: int, b: int) -> dict[str, int]:
        return {"sum": a + b}

    @app.task(name="boom")
    async def boom(n: int) -> None:
        raise aqw.Reject(f"no {n}")

    try:
        added = await app.tasks["add"].enqueue({"a": 2, "b": 3})
        boomed = await app.tasks["boom"].enqueue(7)
        async with Worker(app, concurrency=2, grace=1.0):
            assert await app.result(added, timeout=10) == {"sum": 5}
            with pytest.raises(aqw.JobFailed):
                await app.result(boomed, timeout=10)
        ran = await kit("job", "wait", added, "--timeout", "5")
        assert ran.status == 0, ran.err
        assert ran.out == f"job {added}: succeeded\n" + json.dumps({"sum": 5}, indent=2) + "\n"
        record = (await kit("job", "show", added, "--json")).json
        assert (record["state"], record["result"], record["task"]) == (
            "succeeded",
            {"sum": 5},
            "add",
        )
        ran = await kit("job", "wait", boomed, "--timeout", "5")
        assert ran.status == 3
        entry = (await app.job(boomed)).dlq_entry  # type: ignore[union-attr]
        assert entry and f"aqw dlq show {entry}" in ran.out
        assert (await kit("dlq", "show", boomed, "--json")).json["id"] == entry
    finally:
        await app.close()


# -- the rendering, unit by unit ------------------------------------------------------------------


def test_render_escapes_what_the_broker_holds() -> None:
    now = 1_800_000_000.0
    info = JobInfo.from_fields(
        "j\x1b[2J",
        "q",
        {
            "state": "failed",
            "task": "t\x1b]0;x\x07",
            "attempts": "abc",
            "enqueued_at": repr(now - 3 * 3600 - 120),
            "message": "half\u202eway",
            "progress": "0.25",
            "error_type": "E",
            "error": "line1\nline2\x1b[31m",
            "traceback": "Traceback:\n\x1b[2J  boom\r\n",
            "result": json.dumps({"k": "v\x1b[0m\u2028"}),
        },
    )
    text = render_job(info.id, info, now=now)
    assert "\x1b" not in text and "\u202e" not in text and "\u2028" not in text
    assert "\x07" not in text and "\r" not in text
    shown = rows(text)
    assert shown["attempts"] == "0"
    assert "! damaged fields, read as their defaults: attempts" in text
    assert shown["enqueued"] == "2027-01-15 04:58:00 UTC (3h 2m ago)"
    assert shown["progress"] == "25% half\\u202eway"
    assert shown["error"] == "line1\\nline2\\x1b[31m"
    assert "    \\x1b[2J  boom\\r" in text.splitlines()


def test_render_of_no_record() -> None:
    assert render_job("abc", None) == (
        "job abc: no record (never enqueued on this queue, or expired)\n"
    )


async def test_an_unreachable_redis_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    for argv in (["job", "show", "x"], ["job", "wait", "x"], ["job", "cancel", "x"]):
        status = await run_command([*argv, "--broker", url, "--queue", "q"])
        err = capsys.readouterr().err
        assert status == 1, (argv, err)
        [line] = err.splitlines()
        assert line.startswith("aqw: error: cannot reach the broker"), line


# -- aqw dlq show: the search bound, damaged entries (raw Redis writes) ---------------------------


@pytest.mark.redis
async def test_dlq_show_searches_a_bounded_part_of_the_dlq(
    redis_kit: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit = redis_kit
    raw, queue = kit.backend.raw, kit.backend.queue
    assert raw is not None
    dead = [await kit.dead(n) for n in range(3)]
    for job, _ in dead:  # their records expired
        await raw.delete(f"aqw:{{{queue}}}:job:{job.id}")
    monkeypatch.setattr("aqw.cli._dlq.SCAN_LIMIT", 2)
    ran = await kit("dlq", "show", dead[1][0].id)
    assert ran.status == 0, ran.err
    assert ran.out.startswith(f"dead job {dead[1][1]}\n")
    assert "by searching the dead-letter queue" in ran.err
    ran = await kit("dlq", "show", dead[2][0].id)  # the third entry: past the bound
    assert ran.status == 2
    assert ran.err.endswith(
        "and none of the first 2 dead jobs has that job id (the rest were not searched)\n"
    )


@pytest.mark.redis
async def test_dlq_show_of_a_damaged_entry_names_the_damage(redis_kit: Kit) -> None:
    kit = redis_kit
    assert kit.backend.raw is not None
    entry = await kit.backend.raw.xadd(
        f"aqw:{{{kit.backend.queue}}}:dlq",
        {
            "j": b"not a job \x1b[2J",
            "task": "t\x1b[31m",
            "job_id": "j1",
            "error": "E: x",
            "attempts": "abc",
            "first": "yesterday",
            "last": "1e300",
        },
    )
    ran = await kit("dlq", "show", entry.decode())
    assert ran.status == 0, ran.err
    assert "\x1b" not in ran.out
    lines = ran.out.splitlines()
    assert "  ! damaged entry: attempts 'abc' is not a count" in lines
    assert sum(line.startswith("  ! damaged entry:") for line in lines) == 3
    assert rows(ran.out)["first failed"] == "-"  # damaged: named above
    assert rows(ran.out)["task"] == "t\\x1b[31m"
    assert lines[-2:] == ["  envelope (not a valid job, as stored):", "    not a job \\x1b[2J"]
