"""Forged or damaged state in Redis must not take the queue down.

What a hostile tester wrote into aqw's keys, and what must hold then:

- a fencing counter at 2^63 - 1 or not an integer: acquiring a lease raises
  ``aqw.errors.FenceCorrupted`` naming the key, writes nothing (no lease key, counter
  untouched), and ``aqw status`` reports it and exits 0;
- a DLQ entry whose ``attempts`` is ``"abc"``, with terminal escapes in its task, error and
  traceback: ``aqw dlq list`` / ``show`` exit 0, say the entry is damaged, and print no raw
  ESC (or other control) byte;
- heartbeats that are not JSON or not of a worker's shape, a stats counter that is not an
  integer, running jobs' records with bad numbers: ``aqw status`` (text and ``--json``) exits
  0 and names the damage, and the Monitor evaluates without raising; ``aqw status JOB_ID``
  names a record's damaged fields, and a record key that is not a hash reads as no record
  (exit 6, as for an unknown job).

The CLI runs as ``python -m aqw`` (a subprocess, as an operator runs it) on the real Redis;
the library-level checks run on fakeredis and the real Redis (``redis_backend``).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from typing import Any

import pytest
import redis
from conftest import REDIS_URL, Backend

import aqw
from aqw import RedisLeaseBackend
from aqw._readback import to_float, to_int
from aqw._redis.keys import QueueKeys
from aqw._text import printable
from aqw.app import dead_job_json
from aqw.brokers.memory import MemoryBroker
from aqw.brokers.redis import RedisBroker
from aqw.cli._job import EXIT_UNKNOWN_JOB
from aqw.errors import FenceCorrupted
from aqw.lease import Lease
from aqw.monitor import CallbackSink, Monitor
from aqw.status import gather_status, render
from tests._cli_runs import run_aqw

pytestmark = pytest.mark.timeout(60)

INT64_MAX = str(2**63 - 1)
ESC = b"\x1b"
#: Bytes no terminal output of aqw may contain: C0 controls but \n, DEL, and C1 (as UTF-8).
CONTROLS = (
    [bytes([c]) for c in range(0x20) if c != 0x0A]
    + [b"\x7f"]
    + [chr(c).encode() for c in range(0x80, 0xA0)]
)


def raw_controls(out: bytes) -> list[bytes]:
    return [c for c in CONTROLS if c in out]


def aqw_cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[bytes]:
    return run_aqw(["--log-level", "WARNING", *argv], None, env, text=False)


def ok(done: subprocess.CompletedProcess[bytes]) -> bytes:
    assert done.returncode == 0, (done.returncode, done.stderr.decode(errors="replace"))
    assert b"Traceback" not in done.stderr, done.stderr.decode(errors="replace")
    return done.stdout


@pytest.fixture
def cli_env(subprocess_env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in subprocess_env.items() if not k.startswith("AQW_")}


@pytest.fixture
def sync_redis(redis_url: str) -> Any:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


# -- text made safe ----------------------------------------------------------------------------


def test_printable_escapes_controls_and_keeps_newlines_only_when_asked() -> None:
    assert printable("plain text, ünïcode ✓") == "plain text, ünïcode ✓"
    assert printable("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert printable("bell\x07 del\x7f csi\x9b nul\x00 cr\r") == (
        "bell\\x07 del\\x7f csi\\x9b nul\\x00 cr\\r"
    )
    assert printable("rtl\u202eoverride zw\u200b") == "rtl\\u202eoverride zw\\u200b"
    assert printable("line1\nline2\tx") == "line1\\nline2\\tx"
    assert printable("line1\nline2\tx\x1b", keep_newlines=True) == "line1\nline2\tx\\x1b"
    assert printable(42) == "42"


def test_tolerant_parsers_give_defaults_instead_of_raising() -> None:
    assert to_int(b"12", None) == 12 and to_int("-3", None) == -3 and to_int(7, None) == 7
    for bad in (b"abc", "1.5", "", " 1", "1_000", True, None, [], INT64_MAX + "0", b"\xff"):
        assert to_int(bad, -1) == -1, bad
    assert to_float(b"1712345678.25", None) == 1712345678.25 and to_float(3, None) == 3.0
    for bad in (b"x", "nan", "inf", "1e400", float("nan"), "9" * 100, False, {}):
        assert to_float(bad, -1.0) == -1.0, bad


# -- fencing counters --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [INT64_MAX, "abc", "-1", "007", str(RedisLeaseBackend.FENCE_LIMIT)]
)
async def test_a_damaged_fence_refuses_job_leases_and_writes_nothing(
    redis_backend: Backend, value: str
) -> None:
    raw = redis_backend.raw
    assert raw is not None
    broker = redis_backend.app().broker
    assert isinstance(broker, RedisBroker)
    fence = broker.keys.fence
    await raw.set(fence, value)
    backends = {
        "batched (the runtime's)": broker.lease_backend(),
        "direct": RedisLeaseBackend(raw, fence_key=fence),
    }
    for how, lease_backend in backends.items():
        key = broker.keys.lease(f"job-{how[0]}")
        with pytest.raises(FenceCorrupted) as caught:
            await lease_backend.acquire(key, "token", 5000)
        assert fence in str(caught.value) and caught.value.key == fence, how
        assert "\n" not in str(caught.value) and "SET" in str(caught.value)
        assert await raw.exists(key) == 0, f"{how}: a lease key was left behind"
        with pytest.raises(FenceCorrupted):
            async with Lease(lease_backend, key, ttl=5):
                pytest.fail("the block ran without a fencing token")
        assert await raw.exists(key) == 0
    # many leases at once (merged into one script call) all fail, none is taken
    keys = [broker.keys.lease(f"many-{i}") for i in range(5)]
    lease_backend = broker.lease_backend()
    results = await asyncio.gather(
        *(lease_backend.acquire(k, "token", 5000) for k in keys), return_exceptions=True
    )
    assert all(isinstance(r, FenceCorrupted) for r in results), results
    assert await raw.exists(*keys) == 0
    assert await raw.get(fence) == value.encode(), "the counter must never be reset silently"


async def test_the_fence_counts_up_to_its_limit_then_stops(redis_backend: Backend) -> None:
    raw = redis_backend.raw
    assert raw is not None
    broker = redis_backend.app().broker
    assert isinstance(broker, RedisBroker)
    limit = RedisLeaseBackend.FENCE_LIMIT
    await raw.set(broker.keys.fence, str(limit - 2))
    lease_backend = broker.lease_backend()
    first = await lease_backend.acquire(broker.keys.lease("a"), "t", 5000)
    second = await lease_backend.acquire(broker.keys.lease("b"), "t", 5000)
    assert (first, second) == (limit - 1, limit)  # exact: no double rounding at 2^53
    with pytest.raises(FenceCorrupted):
        await lease_backend.acquire(broker.keys.lease("c"), "t", 5000)
    assert await raw.exists(broker.keys.lease("c")) == 0
    # an operator SETs a value the check accepts (in real life: above every token handed out)
    await raw.set(broker.keys.fence, "1000")
    assert await lease_backend.acquire(broker.keys.lease("d"), "t", 5000) == 1001


async def test_status_reports_a_damaged_fence(redis_backend: Backend) -> None:
    raw = redis_backend.raw
    assert raw is not None
    broker = redis_backend.app().broker
    assert isinstance(broker, RedisBroker)
    await raw.set(broker.keys.fence, INT64_MAX)
    status = await gather_status(broker)
    [problem] = [p for p in status["problems"] if "fencing counter" in p]
    assert broker.keys.fence in problem and INT64_MAX in problem
    assert broker.keys.fence in render(status)
    await raw.set(broker.keys.fence, "12")
    assert not [p for p in (await gather_status(broker))["problems"] if "fencing" in p]


@pytest.mark.redis
@pytest.mark.parametrize("value", [INT64_MAX, "abc"])
def test_aqw_status_names_a_damaged_fence_and_exits_0(
    queue_name: str, cli_env: dict[str, str], sync_redis: Any, value: str
) -> None:
    keys = QueueKeys(queue_name)
    sync_redis.set(keys.fence, value)
    target = ["--broker", REDIS_URL, "--queue", queue_name]
    text = ok(aqw_cli(cli_env, "status", *target)).decode()
    assert "problems: 1" in text and f"fencing counter {keys.fence} is damaged" in text
    data = json.loads(ok(aqw_cli(cli_env, "status", *target, "--json")))
    assert any(keys.fence in p and value in p for p in data["problems"]), data["problems"]


# -- the dead-letter queue ---------------------------------------------------------------------


HOSTILE_DLQ_FIELDS = {
    "j": b"\x1b[2J{not a job",
    "task": "charge\x1b]0;pwned\x07",
    "job_id": "j\x1b[1A",
    "error_type": "ValueError\x1b[31m",
    "error": "card declined \x1b[2J\x1b[H all clear",
    "tb": "Traceback (most recent call last):\n  line 1\x1b[2K\nValueError: \x9b31m",
    "attempts": "abc",
    "first": "yesterday",
    "last": "1e400",
    "worker": "w\r\x08\x08evil",
}


async def test_a_damaged_dlq_entry_reads_with_defaults_and_notes(redis_backend: Backend) -> None:
    raw = redis_backend.raw
    assert raw is not None
    broker = redis_backend.app().broker
    assert isinstance(broker, RedisBroker)
    entry = (await raw.xadd(broker.keys.dlq, HOSTILE_DLQ_FIELDS)).decode()
    await raw.xadd(
        broker.keys.dlq,
        {"task": "t", "attempts": "3", "last": "1700000000.5", "error": "\xff".encode("latin-1")},
    )
    [dead, intact] = await broker.dlq_list()
    assert dead.damaged and dead.id == entry
    assert (dead.attempts, dead.first_failed_at, dead.last_failed_at) == (0, 0.0, 0.0)
    assert {n.split()[0] for n in dead.damaged} == {"attempts", "first", "last"}
    assert "'abc'" in " ".join(dead.damaged)
    assert dead.as_dict()["damaged"] == list(dead.damaged)
    assert intact.damaged == ()
    assert (intact.attempts, intact.last_failed_at, intact.error) == (3, 1700000000.5, "\ufffd")
    assert await broker.dlq_get(entry) == dead
    assert json.loads(dead_job_json(intact))["damaged"] == []
    assert json.loads(dead_job_json(dead))["damaged"] == list(dead.damaged)


@pytest.mark.redis
def test_aqw_dlq_list_and_show_of_a_hostile_entry_exit_0_without_raw_escapes(
    queue_name: str, cli_env: dict[str, str], sync_redis: Any
) -> None:
    keys = QueueKeys(queue_name)
    entry = sync_redis.xadd(keys.dlq, HOSTILE_DLQ_FIELDS).decode()
    target = ["--broker", REDIS_URL, "--queue", queue_name]

    listed = ok(aqw_cli(cli_env, "dlq", "list", *target))
    assert raw_controls(listed) == [], listed
    text = listed.decode()
    assert entry in text and "damaged entry: attempts 'abc'" in text
    assert "card declined \\x1b[2J\\x1b[H all clear" in text
    assert "charge\\x1b]0;pwned\\x07" in text

    as_json = ok(aqw_cli(cli_env, "dlq", "list", *target, "--json"))
    assert raw_controls(as_json) == []
    [item] = json.loads(as_json)
    assert item["error"] == HOSTILE_DLQ_FIELDS["error"] and item["attempts"] == 0
    assert any(n.startswith("attempts") for n in item["damaged"])

    human = ok(aqw_cli(cli_env, "dlq", "show", entry, *target))  # the human view
    assert raw_controls(human) == [], human
    assert entry in human.decode() and "attempts 'abc'" in human.decode(), human

    shown = ok(aqw_cli(cli_env, "dlq", "show", entry, *target, "--json"))
    assert raw_controls(shown) == [], shown
    data = json.loads(shown)
    assert data["traceback"] == HOSTILE_DLQ_FIELDS["tb"] and data["job"] is None
    assert any(n.startswith("attempts") for n in data["damaged"])


# -- heartbeats, stats, job states -------------------------------------------------------------


def good_beat(name: str, now: float) -> dict[str, Any]:
    return {
        "worker": name,
        "queue": "q",
        "pid": 7,
        "state": "running",
        "at": now,
        "concurrency": 4,
        "in_flight": 1,
        "leases": 1,
        "last_1m": {"processed": 2},
        "last_5m": {"processed": 3, "retried": 1},
        "duration_5m": {"p50": 0.01, "p99": 0.02},
        "stuck": [],
        "errors": [],
        "runaway": [],
    }


def damaged_beats(now: float) -> dict[str, bytes]:
    """Worker name -> the value stored at its heartbeat key."""
    return {
        "w-notjson": b"not json",
        "w-binary": b"\xff\xfe\x00",
        "w-list": b"[1, 2, 3]",
        "w-nan": json.dumps({**good_beat("w-nan", now), "at": float("nan")}).encode(),
        "w-at": json.dumps({**good_beat("w-at", now), "at": "yesterday"}).encode(),
        "w-window": json.dumps(
            {**good_beat("w-window", now), "last_5m": {"processed": "x"}}
        ).encode(),
        "w-stuck": json.dumps({**good_beat("w-stuck", now), "stuck": [{"sla": "x"}]}).encode(),
        "w-deep": b"[" * 100_000 + b"]" * 100_000,
    }


def forged_monitor_beat(queue: str, now: float) -> bytes:
    beat = {
        "kind": "monitor",
        "monitor": "forged",
        "queue": queue,
        "at": now + 60,
        "alerts": [{"rule": "x"}],
        "state": {"baseline": "lots"},
    }
    return json.dumps(beat).encode()


def damage_commands(queue: str, now: float) -> list[tuple[Any, ...]]:
    """The Redis commands that write the damaged state (heartbeats, stats, job states)."""
    keys = QueueKeys(queue)
    beats = {
        **damaged_beats(now),
        "monitor:forged": forged_monitor_beat(queue, now),
        "w-good\x1b[2J": json.dumps(good_beat("w-good\x1b[2J", now)).encode(),
    }
    commands: list[tuple[Any, ...]] = []
    for name, value in beats.items():
        commands += [("SET", keys.worker(name), value, "PX", 60_000), ("SADD", keys.workers, name)]
    return [
        *commands,
        ("HSET", keys.stats, "processed", "12", "x", "x", "dead", "1.5"),
        # a running job's record (aqw/record.py) with numbers that do not parse
        (
            "HSET",
            keys.job_state("j-bad"),
            "state",
            "running",
            "worker",
            "gone",
            "task",
            "t",
            "started_at",
            "abc",
            "lease_expires_at",
            "1e999",
            "attempts",
            "one",
        ),
        ("ZADD", keys.running, 0, "j-bad", 1, "j-str"),
        ("SET", keys.job_state("j-str"), "not a hash"),
    ]


async def write_damage(backend: Backend, now: float) -> None:
    assert backend.raw is not None
    for command in damage_commands(backend.queue, now):
        await backend.raw.execute_command(*command)


async def test_status_leaves_damaged_heartbeats_out_and_names_them(
    redis_backend: Backend,
) -> None:
    now = time.time()
    await write_damage(redis_backend, now)
    broker = redis_backend.app().broker
    status = await gather_status(broker)
    assert [w["worker"] for w in status["workers"]] == ["w-good\x1b[2J"]
    assert (status["concurrency"], status["in_flight"], status["last_5m"]["processed"]) == (4, 1, 3)
    problems = status["problems"]
    for name in [*damaged_beats(now), "monitor:forged"]:
        assert any(p.startswith(f"damaged heartbeat from worker {name}:") for p in problems), (
            name,
            problems,
        )
    assert any("'x'" in p and "stats" in p for p in problems), problems
    assert any("'dead'" in p and "'1.5'" in p for p in problems), problems
    assert status["counters"] == {"processed": 12}
    assert status["monitor"] is None  # the forged monitor heartbeat is not believed
    text = render(status)
    assert "\x1b" not in text and "w-good\\x1b[2J" in text
    assert "damaged heartbeat from worker w-notjson" in text
    json.loads(json.dumps(status, allow_nan=False))


async def test_broken_key_types_are_reported_not_raised(redis_backend: Backend) -> None:
    raw = redis_backend.raw
    assert raw is not None
    keys = QueueKeys(redis_backend.queue)
    await raw.set(keys.workers, "not a set")
    await raw.set(keys.stats, "not a hash")
    await raw.hset(keys.fence, "not", "a string")
    broker = redis_backend.app().broker
    status = await gather_status(broker)
    problems = " | ".join(status["problems"])
    assert keys.workers in problems and keys.stats in problems and keys.fence in problems
    assert status["workers"] == [] and status["counters"] == {}


async def test_heartbeat_reads_are_capped(redis_backend: Backend) -> None:
    raw = redis_backend.raw
    assert raw is not None
    keys = QueueKeys(redis_backend.queue)
    await raw.sadd(keys.workers, *[f"ghost-{i:04d}" for i in range(1500)])
    await raw.set(keys.worker("ghost-0000"), json.dumps(good_beat("ghost-0000", time.time())))
    beats = await redis_backend.app().broker.status.heartbeats()
    assert [b["worker"] for b in beats] == ["ghost-0000"]
    left = await raw.scard(keys.workers)
    assert 500 <= left < 1500  # at most 1000 names were read (and the gone ones dropped)


async def test_job_states_with_bad_numbers_are_marked_damaged(redis_backend: Backend) -> None:
    await write_damage(redis_backend, time.time())
    broker = redis_backend.app().broker
    states = {s["job_id"]: s for s in await broker.records.running_states()}
    assert set(states) == {"j-bad", "j-str"}
    assert all("damaged" in s for s in states.values())
    for field in ("started_at", "lease_expires_at", "attempt"):
        assert field in states["j-bad"]["damaged"]
    one = await broker.records.running_state("j-str")
    assert one is not None and "not a hash" in one["damaged"]


async def test_the_monitor_evaluates_on_damaged_state(redis_backend: Backend) -> None:
    now = time.time()
    await write_damage(redis_backend, now)
    broker = redis_backend.app().broker
    fired: list[aqw.Alert] = []
    monitor = Monitor(broker, sinks=[CallbackSink(fired.append)], interval=0.05, min_processed=1)
    await monitor.evaluate_once()  # raises if a damaged value reaches a rule
    await monitor.evaluate_once()
    # and run(): restoring from the forged monitor heartbeat must not keep it from evaluating
    other = Monitor(redis_backend.app().broker, sinks=[CallbackSink(fired.append)], interval=0.05)
    async with other:
        deadline = time.monotonic() + 10
        while other.evaluations < 2:
            assert time.monotonic() < deadline, "the monitor never evaluated"
            await asyncio.sleep(0.02)
    # the good worker's 1 retry / 3 processed is over 5%: the rules still work
    assert "retry_rate" in {a.rule for a in fired}


async def test_status_and_monitor_check_heartbeat_shapes_whatever_the_broker(
    queue_name: str,
) -> None:
    """Not only the Redis broker's reads: status and the monitor check each heartbeat too."""
    broker = MemoryBroker(queue_name)
    now = time.time()
    stuck = {
        "job_id": "j\x1b[2J",
        "task": "t\x1b]0;x\x07",
        "sla": 1.0,
        "started_at": now - 100,
        "worker": "w-good",
    }
    beats = {
        "w-good": {**good_beat("w-good", now), "stuck": [stuck]},
        "w-window": {**good_beat("w-window", now), "last_5m": {"processed": "x"}},
        "w-stuck": {**good_beat("w-stuck", now), "stuck": [{"sla": "x"}]},
        "w-errors": {**good_beat("w-errors", now), "errors": ["boom"]},
        "w-pid": {**good_beat("w-pid", now), "pid": "1", "worker": "w-pid"},
        "monitor:forged": json.loads(forged_monitor_beat(queue_name, now)),
    }
    for name, beat in beats.items():
        await broker.status.publish_heartbeat(name, beat, 60)
    status = await gather_status(broker)
    assert [w["worker"] for w in status["workers"]] == ["w-good"]
    for name in ("w-window", "w-stuck", "w-errors", "w-pid", "forged"):
        assert any(f"worker {name}:" in p for p in status["problems"]), (name, status["problems"])
    fired: list[aqw.Alert] = []
    monitor = Monitor(broker, sinks=[CallbackSink(fired.append)], interval=0.05, min_processed=1)
    await monitor.evaluate_once()
    assert {a.rule for a in fired} == {"retry_rate", "stuck_job"}  # from w-good alone
    assert all(a.summary.isprintable() for a in fired), [a.summary for a in fired]
    assert "\x1b" not in render(await gather_status(broker))
    other = Monitor(broker, sinks=[CallbackSink(fired.append)], interval=0.05)
    async with other:
        deadline = time.monotonic() + 10
        while other.evaluations < 1:
            assert time.monotonic() < deadline, "the monitor never evaluated"
            await asyncio.sleep(0.02)


@pytest.mark.redis
def test_aqw_status_on_damaged_heartbeats_stats_and_job_states_exits_0(
    queue_name: str, cli_env: dict[str, str], sync_redis: Any
) -> None:
    now = time.time()
    for command in damage_commands(queue_name, now):
        sync_redis.execute_command(*command)
    target = ["--broker", REDIS_URL, "--queue", queue_name]

    out = ok(aqw_cli(cli_env, "status", *target))
    assert raw_controls(out) == [], out
    text = out.decode()
    assert "damaged heartbeat from worker w-notjson" in text
    assert "damaged heartbeat from worker w-list" in text
    assert "damaged counter 'x'" in text
    assert "w-good\\x1b[2J" in text and "workers 1" in text

    data = json.loads(ok(aqw_cli(cli_env, "status", *target, "--json")))
    assert any("w-notjson" in p for p in data["problems"])
    assert any("'x'" in p for p in data["problems"])
    assert [w["worker"] for w in data["workers"]] == ["w-good\x1b[2J"]

    # `aqw status JOB_ID` prints the job's record (as `aqw job show`): the fields that do
    # not parse are named and read as their defaults
    job = ok(aqw_cli(cli_env, "status", *target, "j-bad")).decode()
    assert job.startswith("job j-bad: running"), job
    [note] = [line for line in job.splitlines() if "damaged fields" in line]
    assert note.strip() == (
        "! damaged fields, read as their defaults: attempts, started_at, lease_expires_at"
    ), job
    record = json.loads(ok(aqw_cli(cli_env, "status", *target, "j-bad", "--json")))
    assert (record["state"], record["attempts"], record["started_at"]) == ("running", 0, None)
    assert set(record["damaged"]) == {"attempts", "started_at", "lease_expires_at"}
    # a record key that is not a hash is no record aqw wrote: "no record of the job", exit 6
    # (aqw.cli._job.EXIT_UNKNOWN_JOB), with one error line and no traceback
    for argv in (("j-str",), ("j-str", "--json")):
        done = aqw_cli(cli_env, "status", *target, *argv)
        assert done.returncode == EXIT_UNKNOWN_JOB == 6, (done.returncode, done.stderr)
        assert done.stdout == b"" and b"Traceback" not in done.stderr, done.stderr
        assert b"no record of job 'j-str'" in done.stderr, done.stderr
