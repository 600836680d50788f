"""``aqw.testing``: ``use_memory``, ``run_until_idle`` and ``eager`` on a module-level app,
the way a user's tests hold one (its tasks registered at import)."""

from __future__ import annotations

import pytest

import aqw
from aqw.brokers.memory import delete_memory_queue
from aqw.testing import eager, queues_of, run_until_idle, use_memory

pytestmark = pytest.mark.timeout(60)

#: A module-level app on Redis: the tests must never reach it (nothing answers on port 1).
app = aqw.App("redis://127.0.0.1:1/0", queue="kit", retry=aqw.RetryPolicy(base=0.01))
ran: list[str] = []
tries: dict[str, int] = {}


@app.task(keep_result=True)
async def double(n: int) -> int:
    ran.append(f"double:{n}")
    return 2 * n


@app.task(max_retries=0)
async def refuse(reason: str) -> None:
    ran.append(f"refuse:{reason}")
    raise ValueError(reason)


@app.task(max_retries=3)
async def flaky(name: str) -> str:
    tries[name] = tries.get(name, 0) + 1
    if tries[name] < 3:
        raise ConnectionError(f"try {tries[name]}")
    return name


@app.task(queue="kit-mail", keep_result=True)
async def mail(to: str) -> str:
    ran.append(f"mail:{to}")
    return f"sent to {to}"


@app.task
async def signup(user: str) -> None:
    ran.append(f"signup:{user}")
    await mail.enqueue(user)
    ran.append(f"signup-done:{user}")


@app.task
async def forever(n: int) -> None:
    await forever.enqueue(n + 1)


@pytest.fixture
def kit() -> aqw.App:
    ran.clear()
    tries.clear()
    with use_memory(app):
        yield app


async def test_run_until_idle_returns_each_job_as_it_ended(kit: aqw.App) -> None:
    one = await double.enqueue(21)
    bad = await refuse.enqueue("no")
    shaky = await flaky.enqueue("f")
    later = await double.enqueue(5, delay=3600)
    done = await run_until_idle(kit)
    assert sorted(info.id for info in done.jobs) == sorted([one, bad, shaky])
    assert done.states == {"succeeded": 2, "dead": 1}
    assert done.of(one).result == 42
    assert done.of(bad).error is not None and done.of(bad).error.type == "ValueError"
    assert done.of(shaky).attempts == 3 and done.of(shaky).state == "succeeded"
    assert done.stats.retried == 2 and done.stats.dead == 1
    with pytest.raises(KeyError):
        done.of(later)
    assert (await kit.job(later)).state == "delayed"  # left for later, not waited for
    assert [d.job_id for d in await kit.dlq.list()] == [bad]
    again = await run_until_idle(kit)  # a second run ends nothing new
    assert len(again) == 0


async def test_run_until_idle_serves_the_tasks_other_queues(kit: aqw.App) -> None:
    assert queues_of(kit) == ["kit", "kit-mail"]
    sent = await mail.enqueue("a@example.com")
    done = await run_until_idle(kit)
    assert [info.id for info in done.by_task(mail.name)] == [sent]
    assert done.of(sent).result == "sent to a@example.com"


async def test_eager_runs_a_job_before_its_enqueue_returns(kit: aqw.App) -> None:
    with eager(kit):
        job = await double.enqueue(4)
        assert ran == ["double:4"]
        assert (await kit.job(job)).state == "succeeded"
        assert await kit.result(job, timeout=1) == 8
        bad = await refuse.enqueue("nope")
        assert (await kit.job(bad)).state == "dead"  # recorded and dead-lettered as usual
        with pytest.raises(aqw.JobFailed):
            await kit.result(bad, timeout=1)
        with pytest.raises(ValueError):  # validated like a real enqueue: nothing runs
            await double.enqueue("not a number")
        assert ran == ["double:4", "refuse:nope"]
    plain = await double.enqueue(5)  # out of eager mode: queued, not run
    assert (await kit.job(plain)).state == "queued"
    assert ran == ["double:4", "refuse:nope"]


async def test_eager_job_enqueued_by_a_running_job_runs_after_it(kit: aqw.App) -> None:
    with eager(kit):
        await signup.enqueue("ann")
        assert ran == ["signup:ann", "signup-done:ann", "mail:ann"]


async def test_run_until_idle_gives_up_on_a_queue_that_never_empties(kit: aqw.App) -> None:
    await forever.enqueue(0)
    with pytest.raises(TimeoutError, match=r"kit, kit-mail are not idle after 0.5s"):
        await run_until_idle(kit, timeout=0.5)
    assert (await kit.broker.depth()).in_flight == 0  # its worker stopped, the job back


async def test_use_memory_points_back_and_starts_afresh() -> None:
    assert app.broker.system == "redis"
    with use_memory(app):
        assert app.broker.in_process and app.queue == "kit"
        await double.enqueue(1)
        assert (await app.broker.depth()).waiting == 1
    assert app.broker.system == "redis" and app.broker_url == "redis://127.0.0.1:1/0"
    with use_memory(app):
        assert (await app.broker.depth()).waiting == 0  # fresh: the last test's job is gone
    delete_memory_queue("kit")


async def test_run_until_idle_refuses_a_broker_out_of_process() -> None:
    with pytest.raises(TypeError, match=r"queue 'kit' is on redis://.*not memory://"):
        await run_until_idle(app)
    with pytest.raises(TypeError, match="use_memory"), eager(app):
        pass
