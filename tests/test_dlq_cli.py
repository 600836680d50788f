"""``aqw dlq list|show|replay|purge`` through a subprocess (``python -m aqw``) against the real
Redis, with dead jobs produced by a real worker run; after each command the DLQ and the stream
are checked, not only the output.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import REDIS_URL, free_port
from redis.asyncio import Redis

import aqw
from aqw.brokers.redis import RedisBroker
from tests._cli_runs import run_aqw

pytestmark = [pytest.mark.timeout(120), pytest.mark.redis]

APP_SOURCE = '''
"""A small app for the dlq CLI tests: ``--app {module}:app``."""
import aqw
from pydantic import BaseModel, Field

RETRY = aqw.RetryPolicy(max_retries=1, base=0.01, cap=0.02)


class Charge(BaseModel):
    amount: int = Field(gt=0)
    currency: str = "EUR"


def make(broker):
    app = aqw.App(broker, retry=RETRY)

    @app.task(name="charge")
    async def charge(item: Charge) -> None:
        raise ValueError(f"card declined for {item.amount} {item.currency}")

    @app.task(name="email", max_retries=0)
    async def email(to: str) -> None:
        raise aqw.Reject(f"mailbox {to} bounced")

    return app


app = make("memory://")
'''


# -- fixtures -------------------------------------------------------------------------------------


class Cli:
    """Runs ``python -m aqw dlq ...`` on one queue of the real Redis."""

    def __init__(self, queue: str, cwd: Path, env: dict[str, str], module: str) -> None:
        self.queue = queue
        self.cwd = cwd
        self.env = env
        self.module = module

    def __call__(
        self, *args: str, target: bool = True, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        command = ["--log-level", "WARNING", "dlq", *args]
        if target:
            command += ["--broker", REDIS_URL, "--queue", self.queue]
        return run_aqw(command, self.cwd, {**self.env, **(env or {})})

    def ok(self, *args: str, **kwargs: Any) -> str:
        done = self(*args, **kwargs)
        assert done.returncode == 0, f"aqw dlq {' '.join(args)}: {done.returncode}\n{done.stderr}"
        return done.stdout


@pytest.fixture
def app_module(tmp_path: Path) -> ModuleType:
    name = f"dlq_cli_app_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.py"
    path.write_text(APP_SOURCE.replace("{module}", name))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def cli(
    queue_name: str, tmp_path: Path, subprocess_env: dict[str, str], app_module: ModuleType
) -> Cli:
    env = {k: v for k, v in subprocess_env.items() if not k.startswith("AQW_")}
    return Cli(queue_name, tmp_path, env, app_module.__name__)


@pytest.fixture
async def raw() -> Any:
    client = Redis.from_url(REDIS_URL)
    yield client
    await client.aclose()


class Producer:
    """A real worker run on the queue that dead-letters what it is given."""

    def __init__(self, module: ModuleType, queue: str) -> None:
        self.app: aqw.App = module.make(RedisBroker(REDIS_URL, queue))
        self.worker: aqw.Worker | None = None
        self.stopped = False

    async def start(self) -> None:
        self.worker = self.app.worker(concurrency=4)
        await self.worker.start()

    async def stop(self) -> None:
        """Stop the worker (so replayed jobs stay on the stream) and close the app."""
        if not self.stopped:
            self.stopped = True
            assert self.worker is not None
            await self.worker.stop()
            await self.app.close()

    async def dead_letter(
        self, charges: Sequence[int] = (), emails: Sequence[str] = ()
    ) -> list[aqw.DeadJob]:
        """Enqueue, wait until all of them are dead, return the new DLQ entries."""
        assert self.worker is not None
        before = self.worker.stats.dead
        ids = [await self.app.tasks["charge"].enqueue({"amount": a}) for a in charges]
        ids += [await self.app.tasks["email"].enqueue(t) for t in emails]
        deadline = time.monotonic() + 10
        while self.worker.stats.dead < before + len(ids):
            assert time.monotonic() < deadline, "the worker did not dead-letter the jobs"
            await asyncio.sleep(0.01)
        by_job = {d.job_id: d for d in await self.app.dlq.list(limit=1000)}
        return [by_job[i] for i in ids]


@pytest.fixture
async def produce(app_module: ModuleType, queue_name: str) -> Any:
    producer = Producer(app_module, queue_name)
    await producer.start()
    try:
        yield producer
    finally:
        await producer.stop()


async def dlq_ids(raw: Redis, queue: str) -> list[str]:
    return [i.decode() for i, _ in await raw.xrange(f"aqw:{{{queue}}}:dlq")]


async def stream_jobs(raw: Redis, queue: str) -> list[aqw.Job]:
    return [aqw.Job.decode(f[b"j"]) for _, f in await raw.xrange(f"aqw:{{{queue}}}:stream")]


def table_ids(output: str) -> list[str]:
    lines = output.strip().splitlines()
    assert lines[0].split()[:5] == ["ID", "JOB", "TASK", "ERROR", "ATT"], output
    return [line.split()[0] for line in lines[1:]]


# -- list -----------------------------------------------------------------------------------------


async def test_list_in_a_table_as_json_and_filtered(cli: Cli, produce: Producer) -> None:
    assert cli.ok("list").strip() == "the dead-letter queue is empty"
    dead = await produce.dead_letter(charges=[10, 20, 30], emails=["a@x.org", "b@y.org"])
    ids = [d.id for d in dead]
    charges, emails = ids[:3], ids[3:]

    out = cli.ok("list")
    assert sorted(table_ids(out)) == sorted(ids)
    for d in dead:
        row = next(line for line in out.splitlines() if line.startswith(d.id))
        assert row.split()[1:5] == [d.job_id, d.task, d.error_type, str(d.attempts)]
        assert d.error[:40] in row
    assert "ValueError: card declined for 10 EUR" in out
    assert "Reject: mailbox a@x.org bounced" in out

    assert sorted(table_ids(cli.ok("list", "--task", "email"))) == sorted(emails)
    assert sorted(table_ids(cli.ok("list", "--error-type", "ValueError"))) == sorted(charges)
    oldest_charges = await produce.app.dlq.list(task="charge", limit=2)
    limited = cli.ok("list", "--task", "charge", "--error-type", "ValueError", "--limit", "2")
    assert table_ids(limited) == [d.id for d in oldest_charges]
    assert cli.ok("list", "--task", "email", "--error-type", "ValueError").strip() == (
        "no dead job matches"
    )

    items = json.loads(cli.ok("list", "--json"))
    assert sorted(i["id"] for i in items) == sorted(ids)
    by_id = {i["id"]: i for i in items}
    for d in dead:
        item = by_id[d.id]
        got = (item["task"], item["job_id"], item["error_type"], item["error"], item["attempts"])
        assert got == (d.task, d.job_id, d.error_type, d.error, d.attempts)
        assert json.loads(item["data"])["id"] == d.job_id
    assert {i["attempts"] for i in items if i["task"] == "charge"} == {2}
    filtered = json.loads(
        cli.ok("list", "--json", "--task", "charge", "--error-type", "ValueError")
    )
    assert sorted(i["id"] for i in filtered) == sorted(charges)
    assert json.loads(cli.ok("list", "--json", "--task", "nope")) == []

    # the same from AQW_BROKER / AQW_QUEUE instead of arguments
    from_env = cli.ok(
        "list", "--json", target=False, env={"AQW_BROKER": REDIS_URL, "AQW_QUEUE": cli.queue}
    )
    assert sorted(i["id"] for i in json.loads(from_env)) == sorted(ids)
    assert len(await produce.app.dlq.list()) == 5  # listing changed nothing


# -- show -----------------------------------------------------------------------------------------


async def test_show_one_dead_job_and_unknown_ids(cli: Cli, produce: Producer) -> None:
    [charge] = await produce.dead_letter(charges=[42])
    shown = json.loads(cli.ok("show", charge.id, "--json"))
    assert (shown["id"], shown["task"], shown["job_id"]) == (charge.id, "charge", charge.job_id)
    assert (shown["error_type"], shown["attempts"]) == ("ValueError", 2)
    assert shown["error"] == "ValueError: card declined for 42 EUR"
    assert 'raise ValueError(f"card declined' in shown["traceback"]
    assert shown["job"]["payload"] == {"amount": 42, "currency": "EUR"}
    assert shown["job"]["attempt"] == 2
    assert shown["first_failed_at"] <= shown["last_failed_at"]

    for unknown in ("0-1", "99999999999999-0", "not-an-id"):
        done = cli("show", unknown)
        assert done.returncode == 2, (unknown, done.returncode, done.stderr)
        assert f"aqw: error: no dead job with id {unknown!r}" in done.stderr
        assert "Traceback" not in done.stderr
        assert done.stdout == ""


async def test_show_for_people(cli: Cli, produce: Producer) -> None:
    [charge] = await produce.dead_letter(charges=[42])
    out = cli.ok("show", charge.id)
    lines = out.splitlines()
    assert lines[0] == f"dead job {charge.id}"
    fields = {
        name: value.strip()
        for name, _, value in (line.strip().partition("  ") for line in lines[1:10])
    }
    assert fields["job"] == charge.job_id
    assert (fields["task"], fields["error type"], fields["attempts"]) == (
        "charge",
        "ValueError",
        "2",
    )
    assert fields["error"] == "ValueError: card declined for 42 EUR"
    for name in ("first failed", "last failed"):
        assert " UTC (" in fields[name] and fields[name].endswith(" ago)"), fields[name]
    pasted = f"--broker {REDIS_URL} --queue {cli.queue}"  # what reaches this queue when pasted
    assert fields["replay"] == f"aqw dlq replay {charge.id} {pasted}"
    # the traceback as lines, then the envelope once, as indented JSON
    tb = out.split("  traceback:\n", 1)[1].split("  envelope:\n", 1)[0].splitlines()
    assert tb[0] == "    Traceback (most recent call last):"
    assert tb[-1] == "    ValueError: card declined for 42 EUR"
    envelope = json.loads(
        "\n".join(line[4:] for line in out.split("  envelope:\n")[1].splitlines())
    )
    assert (envelope["id"], envelope["payload"]) == (
        charge.job_id,
        {"amount": 42, "currency": "EUR"},
    )
    assert out.count('"payload"') == 1


async def test_show_by_job_id_through_the_record_or_a_search(
    cli: Cli, produce: Producer, raw: Redis
) -> None:
    [charge, email] = await produce.dead_letter(charges=[5], emails=["a@x.org"])
    by_entry = cli("show", charge.id, "--json")
    by_job = cli("show", charge.job_id, "--json")
    assert by_job.returncode == 0, by_job.stderr
    assert json.loads(by_job.stdout) == json.loads(by_entry.stdout)

    # the job's record gone (expired): the DLQ is searched for the job id, and that is said
    await raw.delete(f"aqw:{{{cli.queue}}}:job:{email.job_id}")
    done = cli("show", email.job_id)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"dead job {email.id}\n")
    assert done.stderr == (
        f"note: no record of job {email.job_id} (expired?); found its entry {email.id} "
        "by searching the dead-letter queue\n"
    )

    # a job id with no record and no entry
    done = cli("show", "f" * 32)
    assert done.returncode == 2
    assert done.stderr == (
        f"aqw: error: no dead job with id {'f' * 32!r}: no entry, no record of a job "
        f"{'f' * 32!r}, and no dead job of it\n"
    )


# -- replay ---------------------------------------------------------------------------------------


async def test_replay_by_id_then_task_then_all(cli: Cli, produce: Producer, raw: Redis) -> None:
    dead = await produce.dead_letter(charges=[1, 2], emails=["a@x.org", "b@y.org", "c@z.org"])
    await produce.stop()
    first = dead[0]

    assert cli.ok("replay", first.id).strip() == "1"
    assert first.id not in await dlq_ids(raw, cli.queue)
    assert len(await dlq_ids(raw, cli.queue)) == 4
    [job] = await stream_jobs(raw, cli.queue)
    assert (job.id, job.task, job.attempt) == (first.job_id, "charge", 1)  # attempt reset
    assert job.payload == {"amount": 1, "currency": "EUR"}
    assert not [k for k in job.headers if k.startswith("aqw-")]

    assert cli.ok("replay", "--task", "email").strip() == "3"
    assert await dlq_ids(raw, cli.queue) == [dead[1].id]
    jobs = await stream_jobs(raw, cli.queue)
    assert sorted(j.id for j in jobs[1:]) == sorted(d.job_id for d in dead[2:])
    assert {j.attempt for j in jobs} == {1}

    assert cli.ok("replay", "--task", "email").strip() == "0"  # none left of that task
    assert cli.ok("replay", "--all").strip() == "1"
    assert await dlq_ids(raw, cli.queue) == []
    assert sorted(j.id for j in await stream_jobs(raw, cli.queue)) == sorted(d.job_id for d in dead)
    assert cli.ok("replay", "--all").strip() == "0"


async def test_replay_with_an_edited_payload_needs_the_app_and_validates(
    cli: Cli, produce: Producer, raw: Redis
) -> None:
    [charge, email] = await produce.dead_letter(charges=[7], emails=["x@y.org"])
    await produce.stop()
    before = await dlq_ids(raw, cli.queue)
    payload = '{"amount": 99, "currency": "USD"}'

    # without the app there is nothing to validate against: a usage error
    done = cli("replay", charge.id, "--edit-payload", payload)
    assert done.returncode == 2, done.stderr
    assert "--edit-payload needs the app (--app MODULE:APP)" in done.stderr
    assert await dlq_ids(raw, cli.queue) == before

    # an invalid payload is refused and nothing moves
    done = cli(
        "replay", charge.id, "--edit-payload", '{"amount": -5}', "--app", f"{cli.module}:app"
    )
    assert done.returncode != 0
    assert "amount" in done.stderr and "greater than 0" in done.stderr
    assert await dlq_ids(raw, cli.queue) == before
    assert await stream_jobs(raw, cli.queue) == []

    out = cli.ok("replay", charge.id, "--edit-payload", payload, "--app", f"{cli.module}:app")
    assert out.strip() == "1"
    assert await dlq_ids(raw, cli.queue) == [email.id]
    [job] = await stream_jobs(raw, cli.queue)
    assert (job.id, job.attempt, job.payload) == (
        charge.job_id,
        1,
        {"amount": 99, "currency": "USD"},
    )


async def test_a_bad_edit_payload_is_a_one_line_usage_error(cli: Cli, produce: Producer) -> None:
    [charge] = await produce.dead_letter(charges=[3])
    for bad in ("{not json", '{"amount": -5}'):
        done = cli("replay", charge.id, "--edit-payload", bad, "--app", f"{cli.module}:app")
        assert done.returncode == 2, (bad, done.returncode)
        assert "Traceback" not in done.stderr, done.stderr[-500:]
        assert done.stderr.startswith("aqw: error:"), done.stderr[-500:]


async def test_replay_without_a_selection_is_a_usage_error(cli: Cli, produce: Producer) -> None:
    dead = await produce.dead_letter(emails=["a@x.org"])
    done = cli("replay")
    assert done.returncode == 2
    assert "aqw: error: replay: give entry IDs, --all or --task TASK" in done.stderr
    assert [d.id for d in await produce.app.dlq.list()] == [d.id for d in dead]


async def test_replay_of_an_unknown_id_fails_clearly(cli: Cli, produce: Producer) -> None:
    await produce.dead_letter(emails=["a@x.org"])
    done = cli("replay", "0-1")
    assert done.returncode != 0, done.stdout
    assert "0-1" in done.stderr


# -- purge ----------------------------------------------------------------------------------------


async def age(raw: Redis, queue: str, entry_id: str, seconds: float) -> str:
    """Make a DLQ entry look ``seconds`` older (a stream entry cannot be edited: re-add it with
    earlier failure times and delete the original); returns its new id."""
    key = f"aqw:{{{queue}}}:dlq"
    [(_, fields)] = await raw.xrange(key, entry_id, entry_id)
    fields = dict(fields)
    for name in (b"first", b"last"):
        fields[name] = repr(float(fields[name]) - seconds).encode()
    new_id = (await raw.xadd(key, fields)).decode()
    assert await raw.xdel(key, entry_id) == 1
    return new_id


async def test_purge_older_than_by_id_by_task_and_all(
    cli: Cli, produce: Producer, raw: Redis
) -> None:
    old = await produce.dead_letter(emails=["o1@x.org", "o2@x.org"])
    new = await produce.dead_letter(charges=[5], emails=["n1@x.org", "n2@x.org"])
    old_ids = [await age(raw, cli.queue, d.id, 3600) for d in old]  # failed an hour ago
    dlq = produce.app.dlq
    assert sorted(d.id for d in await dlq.list()) == sorted([*old_ids, *(d.id for d in new)])

    assert cli.ok("purge", "--older-than", "3700").strip() == "0"
    assert cli.ok("purge", "--older-than", "1800").strip() == "2"  # exactly the old ones
    assert sorted(d.id for d in await dlq.list()) == sorted(d.id for d in new)

    done = cli("purge")
    assert done.returncode == 2
    assert "aqw: error: purge: give entry IDs, --older-than SECONDS, --task or --all" in done.stderr
    assert await dlq.count() == 3

    assert cli.ok("purge", new[1].id).strip() == "1"
    assert sorted(d.id for d in await dlq.list()) == sorted([new[0].id, new[2].id])
    assert cli.ok("purge", "--task", "charge").strip() == "1"
    assert [d.id for d in await dlq.list()] == [new[2].id]
    assert cli.ok("purge", "--all").strip() == "1"
    assert await dlq.count() == 0
    assert cli.ok("list").strip() == "the dead-letter queue is empty"


# -- the broker is down ---------------------------------------------------------------------------


def test_an_unreachable_broker_is_a_clear_error(cli: Cli) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    done = cli("list", "--broker", url, "--queue", "q", target=False)
    assert done.returncode == 1
    assert "aqw: error: cannot reach the broker" in done.stderr
    assert "Traceback" not in done.stderr
