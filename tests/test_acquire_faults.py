"""A lost connection exactly when a job's lease is taken: retried, no attempt spent.

Through a fault-injecting TCP proxy in front of a private redis-server, the connection is cut
exactly on the worker's commands that name the job (its id; the job is enqueued past the
proxy, so the first of them is the one that takes the job's lease), after a first job has
warmed the connections and loaded the scripts:

- before the command reaches the server (it never ran): once, and eight times in a row
  (more than any client-side retry could hide, so the error reaches the worker);
- after the server ran it, in place of its reply (the key was taken and the fencing counter
  moved, but the caller cannot know).

And in process, with the job's lease backend (``broker.job_lease_backend(job)``) raising a
connection error (redis-py's, or the builtin one on the memory broker) once or twice before
(or after) delegating.

In every case the job completes exactly once, at attempt 1, promptly, and nothing is
dead-lettered or retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.exceptions
from conftest import Backend, PrivateRedis

import aqw
from aqw.brokers.redis import RedisBroker
from tests._helpers import depth, eventually

pytestmark = pytest.mark.timeout(60)

#: The bound a faulted job completes within, and a lease TTL far longer: a job that waited
#: for a lease of its own to expire could not complete in time. No stopwatch needed.
COMPLETES_WITHIN = 15.0
LONG_TTL = 4 * COMPLETES_WITHIN


class FaultProxy:
    """Forwards TCP from 127.0.0.1 to a Redis server. The next ``cuts`` client-to-server
    chunks containing ``pattern`` each end their connection (both ways): with
    ``when="request"`` before the chunk is forwarded (the command never reaches the server),
    with ``when="reply"`` after it is forwarded, in place of the server's reply."""

    def __init__(self, port: int) -> None:
        self.target = ("127.0.0.1", port)
        self.pattern: bytes | None = None
        self.cuts = 0
        self.when = "request"
        self.cut_times: list[float] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        pair = (writer, up_writer)
        self._writers.update(pair)
        state = {"drop_reply": False}

        def close() -> None:
            for w in pair:
                self._writers.discard(w)
                with contextlib.suppress(Exception):
                    w.close()

        async def upstream() -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while data := await reader.read(65536):
                    if self.pattern is not None and self.cuts > 0 and self.pattern in data:
                        self.cuts -= 1
                        self.cut_times.append(time.monotonic())
                        if self.when == "request":
                            break
                        state["drop_reply"] = True
                    up_writer.write(data)
                    await up_writer.drain()
            close()

        async def downstream() -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while data := await up_reader.read(65536):
                    if state["drop_reply"]:
                        break
                    writer.write(data)
                    await writer.drain()
            close()

        for pump in (upstream(), downstream()):
            task = asyncio.get_running_loop().create_task(pump)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        for w in list(self._writers):
            with contextlib.suppress(Exception):
                w.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.sleep(0)


@pytest.fixture
async def proxy(private_redis: PrivateRedis) -> AsyncIterator[FaultProxy]:
    p = await FaultProxy(private_redis.port).start()
    try:
        yield p
    finally:
        await p.aclose()


class Spy:
    """Spies on the acquire of every job's lease: each job's lease goes through the broker's
    ``job_lease_backend(job)`` (on Redis the job-start step, elsewhere a guard around
    ``lease_backend()``), so ``install`` wraps that method to hand out backends whose
    ``acquire`` comes here. Records what each call returned or raised, and raises
    ``ConnectionError`` for the first ``fail`` calls (``after``: once the real acquire has
    run, as if only its reply was lost)."""

    def __init__(
        self,
        fail: int = 0,
        after: bool = False,
        error: type[Exception] = redis.exceptions.ConnectionError,
    ) -> None:
        self.fail, self.after, self.error = fail, after, error
        self.results: list[Any] = []

    def install(self, broker: aqw.Broker) -> Spy:
        real = broker.job_lease_backend

        def spied(job: aqw.Job, limits: Any = None, delivery: Any = None) -> Any:
            return SpiedLease(real(job, limits, delivery), self)

        broker.job_lease_backend = spied  # type: ignore[method-assign]
        return self

    async def acquire(self, backend: Any, key: str, token: str, ttl_ms: int) -> int | None:
        if self.fail > 0 and not self.after:
            self.fail -= 1
            self.results.append("injected")
            raise self.error("injected: connection reset at acquire")
        try:
            fence = await backend.acquire(key, token, ttl_ms)
        except Exception as exc:
            self.results.append(exc)
            raise
        if self.fail > 0:
            self.fail -= 1
            self.results.append(f"injected after fence {fence}")
            raise self.error("injected: reply lost at acquire")
        self.results.append(fence)
        return fence


class SpiedLease:
    """A job's lease backend whose ``acquire`` goes through the spy."""

    def __init__(self, backend: Any, spy: Spy) -> None:
        self.backend, self.spy = backend, spy

    async def acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        return await self.spy.acquire(self.backend, key, token, ttl_ms)

    async def renew(self, key: str, token: str, ttl_ms: int) -> bool:
        return bool(await self.backend.renew(key, token, ttl_ms))

    async def release(self, key: str, token: str) -> bool:
        return bool(await self.backend.release(key, token))


def register(app: aqw.App, attempts: list[int], lease_ttl: float) -> aqw.Task[Any]:
    @app.task(name="once", lease_ttl=lease_ttl, retry=aqw.RetryPolicy(max_retries=3, base=5.0))
    async def once(n: int, ctx: aqw.Context) -> None:
        attempts.append(ctx.attempt)

    return once


async def check_done_once(
    app: aqw.App, worker: aqw.Worker, attempts: list[int], jobs: int = 1
) -> None:
    assert attempts == [1] * jobs, f"{jobs} jobs ran {len(attempts)} times, at {attempts}"
    s = worker.stats
    assert (s.processed, s.retried, s.dead, s.failed) == (jobs, 0, 0, 0), s
    assert await app.dlq.count() == 0
    assert await depth(app) == (0, 0, 0, 0)
    assert (await app.broker.stats()).get("processed") == jobs
    broker = app.broker
    if isinstance(broker, RedisBroker):
        client = broker.client
        summary: Any = await client.xpending(broker.keys.stream, "aqw")
        assert int(summary["pending"]) == 0
        assert await client.xlen(broker.keys.stream) == 0


async def run_through_proxy(
    proxy: FaultProxy, queue: str, when: str, cuts: int, ttl: float
) -> tuple[aqw.App, aqw.Worker, list[int], Spy, float]:
    """A warm-up job, then a job whose lease commands are cut ``cuts`` times (``when``);
    returns once both are processed: (app, worker, attempts seen, spy, seconds the second
    job took from its enqueue to its ack)."""
    app = aqw.App(RedisBroker(proxy.url, queue))
    attempts: list[int] = []
    once = register(app, attempts, lease_ttl=ttl)
    spy = Spy().install(app.broker)
    # The job is enqueued past the proxy, so the first command of the worker's that names
    # the job's id is the one that takes its lease (the job-start step names the job, and
    # not necessarily its lease key: the script may build that key from the job id).
    direct = RedisBroker(f"redis://{proxy.target[0]}:{proxy.target[1]}/0", queue)
    try:
        async with app.worker(concurrency=4) as worker:
            await once.enqueue(0)  # connections open, scripts loaded
            await eventually(lambda: worker.stats.processed >= 1, 10, "the warm-up job")
            job = aqw.Job(task="once", payload=1)
            proxy.pattern = job.id.encode()
            proxy.when, proxy.cuts = when, cuts
            started = time.monotonic()
            await direct.publish([job])
            # Done within this bound, far below the lease TTL: it never waited for a key of its
            # own to expire (a lease_busy retry would have).
            assert ttl >= 4 * COMPLETES_WITHIN
            await eventually(
                lambda: worker.stats.processed >= 2, COMPLETES_WITHIN, "the job to complete"
            )
            took = time.monotonic() - started
            await asyncio.sleep(0.3)
    finally:
        await direct.close()
    return app, worker, attempts, spy, took


# -- the real connection, cut -------------------------------------------------------------------


@pytest.mark.parametrize("cuts", [1, 8])
async def test_a_connection_cut_before_the_acquire_reaches_the_server(
    proxy: FaultProxy, queue_name: str, cuts: int
) -> None:
    app, worker, attempts, spy, _ = await run_through_proxy(
        proxy, queue_name, "request", cuts, ttl=LONG_TTL
    )
    try:
        assert proxy.cuts == 0 and len(proxy.cut_times) == cuts, "the cuts did not all happen"
        surfaced = [r for r in spy.results if isinstance(r, redis.exceptions.ConnectionError)]
        if cuts > 4:  # more than 1 try + 3 client retries: the error reached the worker
            assert surfaced, f"no ConnectionError reached the worker: {spy.results}"
        await check_done_once(app, worker, attempts, jobs=2)
        fences = [r for r in spy.results if isinstance(r, int)]
        assert fences == [1, 2], (
            f"an acquire that never reached the server took a fence: {spy.results}"
        )
        assert worker.stats.lease_busy == 0, worker.stats
    finally:
        await app.close()


async def test_a_reply_lost_after_the_acquire_ran_on_the_server(
    proxy: FaultProxy, queue_name: str
) -> None:
    """The lease key was taken and a fencing token spent on the server, but the reply was
    lost: the worker must drop its own key (or recognise it) and run the job now, not take
    it for another holder's and leave the job waiting for that key to expire."""
    ttl = LONG_TTL
    app, worker, attempts, spy, took = await run_through_proxy(
        proxy, queue_name, "reply", 1, ttl=ttl
    )
    try:
        assert len(proxy.cut_times) == 1, "the reply was never cut"
        await check_done_once(app, worker, attempts, jobs=2)
        fences = [r for r in spy.results if isinstance(r, int)]
        assert fences[0] == 1 and fences[-1] >= 3, (
            f"the lost acquire did not run on the server: nothing tested ({spy.results})"
        )
        assert worker.stats.lease_busy == 0, (
            f"the worker took its own lease for another holder's ({spy.results}); the job "
            f"completed {took:.2f}s after the enqueue, lease_ttl={ttl}s"
        )
    finally:
        await app.close()


# -- in process: the lease backend raises ---------------------------------------------------------


@pytest.mark.parametrize(("fail", "after"), [(1, False), (2, False), (1, True)])
async def test_connection_errors_at_acquire_are_retried_without_spending_an_attempt(
    backend: Backend, fail: int, after: bool
) -> None:
    app = backend.app()
    attempts: list[int] = []
    once = register(app, attempts, lease_ttl=LONG_TTL)
    # the connection error of the broker's own client (the memory broker has no Redis one)
    error = redis.exceptions.ConnectionError if backend.is_redis else ConnectionResetError
    spy = Spy(fail=fail, after=after, error=error).install(app.broker)
    try:
        async with app.worker(concurrency=4) as worker:
            await once.enqueue(1)
            # well within the lease TTL: it never waited for a lease of its own to expire
            await eventually(
                lambda: worker.stats.processed >= 1, COMPLETES_WITHIN, "the job to complete"
            )
            await asyncio.sleep(0.3)
    finally:
        del app.broker.job_lease_backend  # the instance attribute: back to the method
    injected = [r for r in spy.results if isinstance(r, str)]
    assert len(injected) == fail, spy.results
    assert isinstance(spy.results[-1], int), spy.results
    await check_done_once(app, worker, attempts)
    assert worker.stats.lease_busy == 0, (worker.stats, spy.results)
