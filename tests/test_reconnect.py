"""Connections after a Redis restart: the pooled connections the server closed are opened
anew before anything is sent on them, a read whose reply was lost with its connection is sent
once more on a new one, and an enqueue whose reply was lost never is (it may have been
written: sending it again would enqueue twice). And ``aqw worker --wait-for-broker``, for a
compose file that starts the worker and Redis together.

Every test that stops Redis runs its own redis-server (``PrivateRedis``), never the shared one.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis.exceptions
from _helpers import free_port
from conftest import PrivateRedis
from redis.asyncio import Redis

import aqw
from aqw._redis import scripts
from aqw._redis.client import repeatable
from aqw.cli._main import build_parser
from aqw.cli.supervisor import worker_argv

pytestmark = pytest.mark.timeout(90)

TESTS = Path(__file__).resolve().parent


async def restart(server: PrivateRedis) -> None:
    """Save the server's data, SIGKILL it, start it again on its port, and let the event loop
    read the FIN each pooled connection got (a loop busy elsewhere reads it later: the
    connections then look open, which the retry of a read covers, tested below)."""
    admin = Redis.from_url(server.url)
    try:
        await admin.save()
    finally:
        await admin.aclose()
    port = server.port
    server.kill()
    server.start()
    assert server.port == port, "the server came back on another port"
    for _ in range(10):
        await asyncio.sleep(0.01)


async def test_the_first_calls_after_a_redis_restart_answer(private_redis: PrivateRedis) -> None:
    app = aqw.App(private_redis.url, queue="restart")

    @app.task(name="double", keep_result=True)
    async def double(n: int) -> int:
        return 2 * n

    done = await double.enqueue(21)
    waiting = await double.enqueue(1, delay=3600)
    async with app.worker(concurrency=2, burst=True) as worker:
        await worker.wait_stopped()
    assert await app.result(done, timeout=10) == 42
    client = app.broker.client
    # four connections in the pool, each closed by the restart
    await asyncio.gather(
        *(client.execute_command("BLPOP", "aqw:{restart}:x", 0.05) for _ in range(4))
    )
    await restart(private_redis)
    try:
        info = await app.job(done)  # each on a connection the server closed
        assert info is not None and info.state == "succeeded"
        assert await app.result(done, timeout=10) == 42
        assert await app.cancel(waiting) == "cancelled"
        assert await app.cancel(done) == "finished"
        assert (await app.broker.depth()).delayed == 1
        assert await app.dlq.list() == []
        await double.enqueue(2)  # an enqueue too: nothing had been sent on the closed one
        assert (await app.broker.depth()).waiting == 1
    finally:
        await app.close()


class ReplyLosingProxy:
    """A TCP relay to Redis that, once armed with a marker, loses the first command that
    contains it: ``"drop"`` closes the client's connection without forwarding it (it never
    ran), ``"after"`` forwards it and closes the client's connection instead of passing the
    reply on (it ran, and its reply was lost). ``seen`` counts the chunks with the marker
    that reached the relay, so a command sent twice is seen twice."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.marker = b""
        self.mode = "drop"
        self.seen = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return f"redis://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/0"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        self._writers += (writer, up_writer)
        lose_reply = asyncio.Event()

        async def upward() -> None:
            while data := await reader.read(65536):
                if self.marker and self.marker in data:
                    self.seen += 1
                    if self.seen == 1 and self.mode == "drop":
                        writer.close()
                        up_writer.close()
                        return
                    if self.seen == 1:
                        lose_reply.set()
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()

        async def downward() -> None:
            while data := await up_reader.read(65536):
                if lose_reply.is_set():
                    writer.close()
                    up_writer.close()
                    return
                writer.write(data)
                await writer.drain()
            writer.close()

        for pump in (upward(), downward()):
            task = asyncio.get_running_loop().create_task(self._quietly(pump))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _quietly(self, pump: object) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            await pump  # type: ignore[misc]

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in self._writers:
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()


@pytest.mark.parametrize("mode", ["drop", "after"])
async def test_a_lost_read_is_sent_again_once_and_a_lost_enqueue_never(
    private_redis: PrivateRedis, mode: str
) -> None:
    proxy = ReplyLosingProxy(private_redis.port)
    app = aqw.App(await proxy.start(), queue="lossy")

    @app.task(name="note")
    async def note(text: str) -> None: ...

    try:
        job_id = await note.enqueue("first")
        proxy.mode, proxy.marker = mode, b"HGETALL"
        info = await app.job(job_id)  # lost once, sent again on a new connection
        assert info is not None and info.state == "queued"
        assert proxy.seen == 2
        proxy.mode, proxy.marker, proxy.seen = mode, b"lost-enqueue", 0
        with pytest.raises(redis.exceptions.ConnectionError):
            await note.enqueue("lost-enqueue")
        assert proxy.seen == 1, "an enqueue whose reply was lost was sent again"
        waiting = (await app.broker.depth()).waiting
        assert waiting == (1 if mode == "drop" else 2)  # written once at most, never twice
    finally:
        await app.close()
        await proxy.aclose()


def test_only_reads_and_the_scripts_safe_to_repeat_are_sent_again() -> None:
    assert repeatable(("HGETALL", "aqw:{q}:job:1"))
    assert repeatable((b"XRANGE", "k", "-", "+"))
    assert repeatable(("SCRIPT", "LOAD", "return 1"))
    assert repeatable(scripts.load("cancel").args(["k"], []))
    assert repeatable(scripts.load("result_watch").args(["k"], []))
    for name in ("enqueue", "enqueue_one", "enqueue_unique", "ack", "retry", "job_start"):
        assert not repeatable(scripts.load(name).args(["k"], [])), name
    for command in (("XADD", "s", "*", "j", "{}"), ("SET", "k", "v"), ("BLPOP", "k", 1)):
        assert not repeatable(command), command
    assert not repeatable(("SCRIPT", "FLUSH"))
    assert not repeatable(())


# -- aqw worker --wait-for-broker -------------------------------------------------------------


def aqw_worker(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "aqw", "--log-level", "WARNING", "worker", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=TESTS,
    )


async def test_a_worker_waits_for_a_broker_that_starts_after_it(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    server = PrivateRedis(tmp_path)  # its port chosen, nobody listening yet
    worker = aqw_worker(
        "outage_app:app", "--broker", server.url, "--wait-for-broker", "60", env=subprocess_env
    )
    app = aqw.App(server.url, queue="outage")

    @app.task(name="work", keep_result=True)
    async def work(n: int) -> None: ...

    try:
        assert worker.stderr is not None
        first = await asyncio.to_thread(worker.stderr.readline)  # it waits, and says so
        assert f"waiting for the broker redis://127.0.0.1:{server.port}/0" in first, first
        assert worker.poll() is None
        server.start()
        jobs = [await work.enqueue(n) for n in range(3)]
        for job_id in jobs:  # run by the worker that waited
            info = await app.jobs.wait(job_id, timeout=30)
            assert info.state == "succeeded"
        worker.send_signal(signal.SIGTERM)
        _, rest = await asyncio.to_thread(worker.communicate, timeout=30)
        assert worker.returncode == 0, rest
        assert "3 succeeded" in rest
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=10)
        await app.close()
        server.kill()


def test_without_waiting_a_worker_exits_at_once_with_one_line(
    subprocess_env: dict[str, str],
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    done = aqw_worker("outage_app:app", "--broker", dead, env=subprocess_env)
    _, stderr = done.communicate(timeout=30)
    assert done.returncode == 1, stderr
    # One line, and no "waiting for the broker": it did not wait (communicate bounds the rest).
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aqw: error: cannot reach the redis"), stderr

    env = {**subprocess_env, "AQW_WAIT_FOR_BROKER": "1.5"}  # the variable, for a while only
    done = aqw_worker("outage_app:app", "--broker", dead, env=env)
    _, stderr = done.communicate(timeout=30)
    assert done.returncode == 1, stderr
    lines = stderr.strip().splitlines()
    assert "waiting for the broker" in lines[0], stderr
    assert lines[-1].startswith("aqw: error: cannot reach the redis"), stderr
    assert "no answer for 1.5s of --wait-for-broker" in lines[-1], stderr


def test_the_supervisor_passes_the_wait_on_to_its_workers() -> None:
    args = build_parser().parse_args(["worker", "a:app", "--wait-for-broker", "30", "-p", "2"])
    argv = worker_argv(args)
    assert argv[argv.index("--wait-for-broker") + 1] == "30.0"
