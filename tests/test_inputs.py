"""Inputs that used to be accepted and then broke every job, each refused where it is given,
with one line naming it, before anything is written: non-finite numbers in payloads (and in
kept results), payloads that cannot be JSON, bad App / task / enqueue options, a cron that
never fires, a too-fast ``Every``, task names that would forge log lines; echoes of the
caller's input cut short; the enqueue scripts all-or-nothing; and one periodic task's
failures never stopping the others."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import redis.exceptions
from conftest import Backend
from pydantic import BaseModel

import aqw
from aqw._redis import scripts
from aqw._redis.keys import QueueKeys
from aqw.dashboard._actions import _check_payload
from aqw.schedule import MIN_EVERY
from aqw.worker._scheduler import Scheduler
from tests._helpers import depth

pytestmark = pytest.mark.timeout(60)

NAN, INF = float("nan"), float("inf")
#: Most characters an error message may have when its input was a megabyte.
SHORT = 600
MEGA = "x" * 1_000_000


class Size(BaseModel):
    width: float
    height: float


class Image(BaseModel):
    size: Size
    tags: list[float] = []


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    assert len(text) < SHORT, f"{len(text)} chars: {text[:300]}..."
    return text


def tasks(app: aqw.App) -> dict[str, aqw.Task[Any]]:
    @app.task(name="resize")
    async def resize(image: Image) -> None: ...

    @app.task(name="anything")
    async def anything(x: Any) -> None: ...

    @app.task(name="number")
    async def number(x: float) -> None: ...

    @app.task(name="pair")
    async def pair(a: float, b: dict[str, Any]) -> None: ...

    return dict(app.tasks)


# -- non-finite numbers ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("task", "payload", "said"),
    [
        ("resize", {"size": {"width": NAN, "height": 1}}, "payload field 'size.width' is nan"),
        ("resize", Image(size=Size(width=1, height=-INF)), "payload field 'size.height' is -inf"),
        ("resize", {"size": {"width": 1, "height": 1}, "tags": [1, INF]}, "'tags[1]' is inf"),
        ("anything", {"a": [1, {"b": NAN}]}, "payload field 'a[1].b' is nan"),
        ("anything", INF, "the payload is inf"),
        ("number", NAN, "the payload is nan"),
        ("pair", {"a": 1, "b": {"k": [NAN]}}, "payload field 'b.k[0]' is nan"),
        ("pair", {"a": INF, "b": {}}, "payload field 'a' is inf"),
    ],
)
async def test_a_non_finite_number_is_refused_naming_its_field(
    task: str, payload: Any, said: str
) -> None:
    app = aqw.App("memory://")
    target = tasks(app)[task]
    with pytest.raises(aqw.ConfigError) as err:
        await target.enqueue(payload)
    text = one_line(err.value)
    assert text.startswith(f"task {task!r}: ")
    assert said in text and text.endswith("JSON has no non-finite numbers")
    assert await depth(app) == (0, 0, 0, 0)


async def test_a_non_finite_number_refuses_the_whole_batch_and_every_way_in(
    backend: Backend,
) -> None:
    app = backend.app()
    resize = tasks(app)["resize"]
    good = {"size": {"width": 1, "height": 2}}
    bad = {"size": {"width": 1, "height": NAN}}
    with pytest.raises(aqw.ConfigError, match=r"'size.height' \(payload 2 of 3\) is nan"):
        await resize.enqueue_many([good, bad, good])
    for options in ({"delay": 30}, {"key": "k1"}, {"key": "k2", "debounce": 5.0}):
        with pytest.raises(aqw.ConfigError, match=r"'size\.height' is nan"):
            await resize.enqueue(bad, **options)
    assert await depth(app) == (0, 0, 0, 0)
    await resize.enqueue(good)  # the task itself still works, and a string "NaN" is text
    await tasks_any(app).enqueue({"note": "NaN and -Infinity are words here"})
    assert (await depth(app))[0] == 2


def tasks_any(app: aqw.App) -> aqw.Task[Any]:
    return app.tasks["anything"]


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (object(), "Unable to serialize unknown type"),
        (b"\xff\xfe", "UnicodeDecodeError"),
        ("lone \ud800 surrogate", "surrogates not allowed"),
    ],
)
async def test_a_payload_that_cannot_be_json_is_an_aqw_error_naming_the_task(
    payload: Any, words: str
) -> None:
    app = aqw.App("memory://")
    tasks(app)
    with pytest.raises(aqw.ConfigError) as err:
        await app.tasks["anything"].enqueue(payload)
    text = one_line(err.value)
    assert text.startswith("task 'anything': the payload cannot be written as JSON: ")
    assert words in text
    assert await depth(app) == (0, 0, 0, 0)


async def test_a_list_that_contains_itself_is_an_aqw_error_naming_the_task() -> None:
    app = aqw.App("memory://")
    tasks(app)
    circular: list[Any] = [1]
    circular.append(circular)
    with pytest.raises(aqw.ConfigError, match="'anything': the payload cannot be written"):
        await app.tasks["anything"].enqueue(circular)


async def test_a_dead_job_replayed_with_a_non_finite_payload_is_refused() -> None:
    app = aqw.App("memory://")

    @app.task(name="resize")
    async def resize(image: Image) -> None:
        raise aqw.Reject("no")

    await resize.enqueue({"size": {"width": 1, "height": 2}})
    async with app.worker(burst=True) as worker:
        await worker.wait_stopped()
    (entry,) = await app.dlq.list()
    bad = {"size": {"width": INF, "height": 2}}
    with pytest.raises(aqw.ConfigError, match=r"'resize': payload field 'size\.width' is inf"):
        await app.dlq.replay([entry.id], edit_payload=bad)
    assert await depth(app) == (0, 0, 0, 1)  # still dead, nothing replayed
    # the dashboard's edit form says so before asking: NaN is no JSON number
    dash = SimpleNamespace(app=app)
    text = '{"size": {"width": NaN, "height": 2}}'
    said = _check_payload(dash, "resize", text)  # type: ignore[arg-type]
    assert said == "payload is not JSON: NaN is not a JSON number"


class Score(BaseModel):
    value: float


async def test_a_non_finite_result_is_not_kept_and_the_record_says_why() -> None:
    app = aqw.App("memory://")

    @app.task(name="ratio", keep_result=True)
    async def ratio(x: float) -> dict[str, Any]:
        return {"ratio": [x, NAN]}  # nan cannot be enqueued: the handler makes it

    @app.task(name="score", keep_result=True)
    async def score(x: float) -> Score:
        return Score(value=-x * INF)

    @app.task(name="fine", keep_result=True)
    async def fine(x: float) -> float:
        return x

    first, second, third = await ratio.enqueue(1.0), await score.enqueue(2.0), await fine.enqueue(3)
    async with app.worker(burst=True) as worker:
        await worker.wait_stopped()
    for job_id, said in ((first, "field 'ratio[1]' is nan"), (second, "field 'value' is -inf")):
        with pytest.raises(aqw.ResultNotKept) as err:  # not a record that reads null
            await app.result(job_id, timeout=5)
        assert said in str(err.value) and "JSON has no non-finite numbers" in str(err.value)
        info = await app.job(job_id)
        assert info is not None and info.state == "succeeded" and not info.has_result
    assert await app.result(third, timeout=5) == 3.0


# -- App, task and enqueue options -----------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("lease_ttl", NAN),
        ("lease_ttl", INF),
        ("lease_ttl", "5"),
        ("lease_ttl", 0),
        ("lease_ttl", True),
        ("idempotency_ttl", NAN),
        ("idempotency_ttl", INF),
        ("timeout", NAN),
        ("timeout", "5"),
        ("keep_for", INF),
        ("max_deliveries", NAN),
        ("max_deliveries", 1.5),
        ("max_deliveries", 0),
        ("max_deliveries", True),
        ("max_deliveries", "5"),
        ("queue", 5),
        ("queue", b"q"),
        ("retry", "three times"),
        ("trace_link", "yes"),
        ("cache", "redis://"),
        ("broker", 5),
    ],
)
def test_a_bad_app_option_is_one_line_naming_it(option: str, value: Any) -> None:
    options = {"broker": "memory://", option: value}
    with pytest.raises(aqw.ConfigError) as err:
        aqw.App(**options)
    assert one_line(err.value).startswith(f"App {option}"), str(err.value)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("lease_ttl", NAN),
        ("lease_ttl", INF),
        ("lease_ttl", "5"),
        ("timeout", NAN),
        ("sla", INF),
        ("keep_for", NAN),
        ("max_retries", 1.5),
        ("max_retries", NAN),
        ("max_retries", True),
        ("max_retries", -1),
        ("queue", 5),
        ("priority", 1.0),
        ("keep_result", "yes"),
        ("retry", 3),
        ("invalidates", "user:{user_id}"),
        ("rate_limit", "1" * 1_000_000 + "/s"),
        ("max_payload_bytes", NAN),
    ],
)
def test_a_bad_task_option_is_one_line_naming_the_task_and_option(option: str, value: Any) -> None:
    app = aqw.App("memory://")
    with pytest.raises(aqw.ConfigError) as err:

        @app.task(name="bad", **{option: value})
        async def bad() -> None: ...

    assert one_line(err.value).startswith(f"task 'bad': {option}"), str(err.value)
    assert "bad" not in app.tasks


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"max_retries": True}, "max_retries must be an integer >= 0, got True"),
        ({"base": "5"}, "base must be a finite number > 0, got '5'"),
        ({"cap": INF}, "cap must be a finite number, got inf"),
        ({"jitter": "no"}, "jitter must be True or False, got 'no'"),
    ],
)
def test_a_bad_retry_policy_is_one_line_naming_the_option(
    options: dict[str, Any], said: str
) -> None:
    with pytest.raises(aqw.ConfigError) as err:
        aqw.RetryPolicy(**options)
    assert one_line(err.value) == f"RetryPolicy {said}"


async def test_a_payload_for_a_task_that_takes_none_names_the_task() -> None:
    app = aqw.App("memory://")
    app.task(name="bare")(_noop)
    with pytest.raises(aqw.ConfigError) as err:
        await app.tasks["bare"].enqueue({"x": 1})
    assert one_line(err.value) == "task 'bare': this task takes no payload; pass None"


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"delay": 1e16}, "enqueue: delay must be a finite number of seconds >= 0"),
        ({"delay": INF}, "enqueue: delay"),
        ({"delay": NAN}, "enqueue: delay"),
        ({"delay": -1}, "enqueue: delay"),
        ({"delay": "5"}, "enqueue: delay"),
        ({"delay": True}, "enqueue: delay"),
        ({"at": "tomorrow"}, "enqueue: at must be a datetime"),
        ({"at": 1_900_000_000}, "enqueue: at must be a datetime"),
        ({"at": datetime(9999, 1, 1, tzinfo=UTC)}, "enqueue: at must be less than 1e9"),
        ({"key": 5}, "enqueue: key must be a non-empty string"),
        ({"key": b"k"}, "enqueue: key must be a non-empty string"),
        ({"key": ""}, "enqueue: key must be a non-empty string"),
        ({"key": MEGA}, "enqueue: key must be a non-empty string"),
        ({"headers": {"a": 1}}, "enqueue: headers must be a dict of strings"),
        ({"expires": NAN}, "enqueue: expires"),
        ({"queue": MEGA}, "invalid queue name"),
        ({"priority": 1.0}, "priority must be an integer"),
    ],
)
async def test_a_bad_enqueue_option_is_one_line_and_nothing_is_written(
    backend: Backend, options: dict[str, Any], said: str
) -> None:
    app = backend.app()
    number = tasks(app)["number"]
    with pytest.raises(aqw.ConfigError) as err:
        await number.enqueue(1.0, **options)
    assert said in one_line(err.value)
    assert await depth(app) == (0, 0, 0, 0)


async def test_the_longest_delay_and_a_past_at_are_taken() -> None:
    app = aqw.App("memory://")
    number = tasks(app)["number"]
    await number.enqueue(1.0, delay=86_400 * 365 * 30)
    await number.enqueue(1.0, at=datetime.now(UTC) - timedelta(days=1))  # due: runs now
    await number.enqueue(1.0, delay=0)
    assert await depth(app) == (2, 0, 1, 0)


# -- the enqueue scripts: all or nothing ------------------------------------------------------


async def test_the_enqueue_scripts_check_their_numbers_before_writing(
    redis_backend: Backend,
) -> None:
    client = redis_backend.client()
    keys = QueueKeys(redis_backend.queue)
    record = keys.record("j1")
    prefix = keys.tag + ":"
    far = str(10**20)  # what delay=1e16 made of the record's ttl: PEXPIRE refuses it
    calls: list[tuple[str, list[str], list[Any]]] = [
        (
            "enqueue",
            [keys.stream, keys.delayed],
            [prefix, far, "0", "", "", "", "{}", "j1", "t", 1],
        ),
        (
            "enqueue",
            [keys.stream, keys.delayed],
            [prefix, 1000, far, "1", "", "", "{}", "j1", "t", 1],
        ),
        ("enqueue_one", [keys.stream, record], ["{}", "t", 1, far]),
        (
            "enqueue_unique",
            [keys.idempotency("k"), keys.stream, keys.delayed, keys.done("k"), record],
            ["j1", 1000, "{}", 0, "", "t", 0, 1, "", "k", far],
        ),
        (
            "debounce",
            [keys.debounce("k"), keys.delayed],
            [prefix, 1, far, 0, 1, 1, "j1", "{", "}", "t", 1, "", "k"],
        ),
    ]
    for name, script_keys, argv in calls:
        with pytest.raises(redis.exceptions.ResponseError, match="nothing written"):
            await scripts.load(name)(client, script_keys, argv)
        written = [k async for k in client.scan_iter(f"{keys.tag}:*", count=1000)]
        assert written == [], f"{name} wrote {written}"


# -- what an error repeats of its input -------------------------------------------------------


async def test_a_megabyte_of_input_is_a_short_error() -> None:
    app = aqw.App("memory://")
    tasks(app)
    attempts: list[Any] = [
        lambda: app.job(MEGA),
        lambda: app.cancel(MEGA),
        lambda: app.result(MEGA, timeout=1),
        lambda: app.enqueue(MEGA, [1]),
        lambda: app.tasks["number"].enqueue(1.0, queue=MEGA),
        lambda: app.tasks["number"].enqueue(1.0, key=MEGA),
        lambda: app.tasks["number"].enqueue(1.0, headers={"aqw-group": MEGA}),
    ]
    for attempt in attempts:
        with pytest.raises(aqw.AqwError) as err:
            await attempt()
        one_line(err.value)
    for build in (
        lambda: aqw.App("memory://", queue=MEGA),
        lambda: app.task(name=MEGA)(_noop),
        lambda: app.task(name="c1", schedule=aqw.Cron(MEGA))(_noop),
        lambda: app.task(name="c2", schedule=aqw.Cron("* * * * * " + MEGA))(_noop),
        lambda: app.task(name="c3", schedule=aqw.Cron("* * * * *", tz=MEGA))(_noop),
        lambda: app.task(name="c4", queue=MEGA)(_noop),
    ):
        with pytest.raises(aqw.ConfigError) as err:
            build()
        one_line(err.value)


async def _noop() -> None: ...


async def _other() -> None: ...


@pytest.mark.parametrize(
    "name", ["a\x00b", "forged\n2026-01-01 INFO aqw.worker job ok", "a\rb", "\x1b[2J", "", MEGA, 5]
)
def test_a_task_name_that_could_forge_a_log_line_or_never_fit_is_refused(name: Any) -> None:
    app = aqw.App("memory://")
    with pytest.raises(aqw.ConfigError) as err:
        app.task(name=name)(_noop)
    assert one_line(err.value).startswith("a task name must be a string of 1-200 printable")
    assert not app.tasks


def test_a_task_name_of_200_printable_characters_is_taken() -> None:
    app = aqw.App("memory://")
    app.task(name="é" * 200)(_noop)
    app.task(name="reports.daily summary")(_other)
    assert len(app.tasks) == 2


# -- schedules --------------------------------------------------------------------------------


@pytest.mark.parametrize("expression", ["0 0 31 2 *", "0 0 30 2 *", "0 0 31 4 *", "0 0 0 31 2 *"])
def test_a_cron_that_never_fires_is_refused_at_registration(expression: str) -> None:
    app = aqw.App("memory://")
    with pytest.raises(aqw.ConfigError) as err:
        app.task(name="never", schedule=aqw.Cron(expression))(_noop)
    assert "never fires" in one_line(err.value) and "'never'" in str(err.value)
    app.task(name="leap", schedule=aqw.Cron("0 0 29 2 *"))(_noop)  # every four years: fine


@pytest.mark.parametrize("seconds", [1e-6, 1e-3, 0.5, 0.999])
def test_every_has_a_floor_of_one_second(seconds: float) -> None:
    app = aqw.App("memory://")
    with pytest.raises(aqw.ConfigError, match="every must be at least 1 second") as err:
        app.task(name="fast", schedule=aqw.Every(seconds))(_noop)
    one_line(err.value)
    app.task(name="ok", schedule=aqw.Every(1))(_noop)
    assert MIN_EVERY == 1.0


async def test_one_failing_schedule_never_stops_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="aqw.scheduler")
    app = aqw.App("memory://")
    # registered first: its tick's job is over its own cap, so every enqueue of it is refused
    app.task(name="broken", schedule=aqw.Every(10), max_payload_bytes=1)(_noop)
    app.task(name="fine", schedule=aqw.Every(10))(_noop)
    scheduler = Scheduler(app.broker, app.tasks, asyncio.Event(), app.worker().outage, "w")
    await app.broker.connect()

    def said(level: int) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == level]

    await scheduler.enqueue_due(now=1005.0)  # both start at their next tick
    for now in (1015.0, 1015.5, 1016.2, 1017.0, 1018.3, 1025.0):
        await scheduler.enqueue_due(now=now)
    marks = await app.broker.marks.read()
    assert marks["fine"].tick == 1020.0 and marks["broken"].tick == 1000.0
    assert (await app.broker.depth()).waiting == 2  # the ticks of 1010 and 1020
    errors = said(logging.ERROR)
    assert len(errors) == 1, errors  # said once, with its backoff after it
    assert errors[0].startswith("periodic task broken (every 10s) failed: PayloadTooLarge")
    # tried again after 1 s (1016.2), then after 2 s (1018.3), then after 4 s (1025.0):
    # not at 1015.5 nor 1017.0
    again = [m for m in said(logging.DEBUG) if m.startswith("periodic task broken failed again")]
    assert len(again) == 3, again
    await app.close()
