"""The in-process broker: the default, for tests, scripts and single-process apps."""

import asyncio

import aqw

sent: list[str] = []


def make_app() -> aqw.App:
    app = aqw.App()  # memory://, queue "default": no server, nothing survives the process

    @app.task(name="notify")
    async def notify(user: str) -> None:
        sent.append(user)

    return app


async def test_notify_runs_once_per_job() -> None:
    app = make_app()
    notify = app.get_task("notify")

    await notify("direct")  # calling a task runs the handler here: no queue, no lease
    await notify.enqueue("queued")
    worker = app.worker(burst=True)
    await worker.run()

    assert sent == ["direct", "queued"]
    assert worker.stats.processed == 1
    assert (await app.broker.depth()).as_dict() == {
        "waiting": 0,
        "in_flight": 0,
        "delayed": 0,
        "dead": 0,
    }
    await app.close()


if __name__ == "__main__":
    asyncio.run(test_notify_runs_once_per_job())
    print("ok:", sent)
