"""A feature that needs a part shared across processes is refused, in one line naming the
part and the fix, when the broker keeps that part in this process only; the memory broker,
whose whole queue is in the process, is allowed (``aqw/worker/_needs.py``)."""

from __future__ import annotations

import plugin_broker
import pytest

import aqw
from aqw.brokers.memory import MemoryBroker
from aqw.worker._needs import check_shared_parts


class OutOfProcess(plugin_broker.PlugBroker):
    """The plugin broker, told its queue is not this process's alone: its parts (all
    in-process ones) are then not shared."""

    in_process = False


def app_on(broker: aqw.Broker) -> aqw.App:
    app = aqw.App(broker)

    @app.task(name="keep", keep_result=True)
    async def keep() -> int:
        return 1

    @app.task(name="tick", schedule=aqw.Every(60))
    async def tick() -> None: ...

    return app


def one_line(exc: pytest.ExceptionInfo[aqw.ConfigError]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_keep_result_needs_shared_records(queue_name: str) -> None:
    app = app_on(OutOfProcess(queue_name))
    with pytest.raises(aqw.ConfigError) as refused:
        check_shared_parts(app.broker, app.tasks)
    message = one_line(refused)
    assert message.startswith("task 'keep': keep_result needs job records shared")
    assert "plug broker of queue" in message and "in this process only" in message


def test_periodic_tasks_need_shared_schedule_marks(queue_name: str) -> None:
    app = app_on(OutOfProcess(queue_name))
    del app.tasks["keep"]
    with pytest.raises(aqw.ConfigError) as refused:
        check_shared_parts(app.broker, app.tasks)
    assert one_line(refused).startswith("periodic tasks (tick) need schedule marks shared")


def test_limits_need_a_start_step_that_enforces_them(queue_name: str) -> None:
    app = aqw.App(OutOfProcess(queue_name))

    @app.task(name="capped", rate_limit="5/s")
    async def capped() -> None: ...

    with pytest.raises(aqw.ConfigError, match="task 'capped': rate_limit needs a broker"):
        app.worker()


async def test_debounce_needs_a_debounce_part(queue_name: str) -> None:
    app = aqw.App(OutOfProcess(queue_name))

    @app.task(name="late")
    async def late() -> None: ...

    with pytest.raises(aqw.ConfigError, match="debounce needs a broker that can replace"):
        await late.enqueue(None, key="k", debounce=1.0)


def test_the_memory_broker_is_in_process_and_allowed_everything(queue_name: str) -> None:
    broker = MemoryBroker(queue_name)
    assert not broker.records.shared and broker.in_process
    app = app_on(broker)
    check_shared_parts(app.broker, app.tasks)  # no refusal
    assert broker.describe().endswith("(in-process only)")
