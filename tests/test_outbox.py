"""The transactional outbox against the real PostgreSQL (``AQW_TEST_PG_DSN``, by default
database ``test`` on 127.0.0.1:5432) and the real Redis.

Every test has its own schema (``aqw_ob_<hex>``, dropped at its end) and its own queue
(``aqw:{t-<hex>}:*``, deleted at the end). PostgreSQL or Redis not answering is a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import psycopg
import pytest
import redis
import sqlalchemy
from pydantic import BaseModel, ValidationError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, create_async_engine

import aqw
from aqw.errors import LeaseLost
from aqw.outbox import Outbox, Relay
from tests._helpers import PG_DSNS, REDIS_URL, eventually, pg_where, require_real_redis

pytestmark = pytest.mark.timeout(90)
HERE = Path(__file__).resolve().parent


class Receipt(BaseModel):
    order_id: int


@dataclass
class Setup:
    dsn: str
    schema: str
    queue: str
    conn: asyncpg.Connection

    def app(self, **outbox: float) -> aqw.App:
        app = aqw.App(
            REDIS_URL,
            queue=self.queue,
            outbox=Outbox(self.dsn, schema=self.schema, poll=outbox.pop("poll", 0.2), **outbox),  # type: ignore[arg-type]
        )
        return app

    async def rows(self) -> int:
        return int(await self.conn.fetchval(f'SELECT count(*) FROM "{self.schema}".aqw_outbox'))

    def stream_jobs(self) -> list[dict[str, object]]:
        """The jobs in the queue's stream, as JSON."""
        client = redis.Redis.from_url(REDIS_URL, socket_timeout=5)
        try:
            entries = client.xrange(f"aqw:{{{self.queue}}}:stream")
        finally:
            client.close()
        return [json.loads(fields[b"j"]) for _, fields in entries]


async def _dsn() -> str:
    errors = []
    for dsn in PG_DSNS:
        try:
            conn = await asyncpg.connect(dsn, timeout=5)
        except Exception as exc:
            errors.append(repr(exc))
            continue
        await conn.close()
        return dsn
    pytest.fail(f"PostgreSQL at {pg_where(PG_DSNS[0])} is not answering: {errors}", pytrace=False)


@pytest.fixture
def queue() -> Iterator[str]:
    require_real_redis()
    name = f"t-{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=5)
    try:
        keys = list(client.scan_iter(match=f"aqw:{{{name}}}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()


@pytest.fixture
async def setup(queue: str) -> AsyncIterator[Setup]:
    dsn = await _dsn()
    schema = f"aqw_ob_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(dsn)
    try:
        await Outbox(dsn, schema=schema).migrate()
        yield Setup(dsn, schema, queue, conn)
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()


def _task(app: aqw.App, seen: list[int] | None = None) -> aqw.Task[None]:
    @app.task(name="send_receipt")
    async def send_receipt(receipt: Receipt) -> None:
        if seen is not None:
            seen.append(receipt.order_id)

    return send_receipt


async def _relay_all(setup: Setup, app: aqw.App, fence: int = 1) -> int:
    """Relay every row in batches, as a leader with fencing token ``fence``."""
    assert app.outbox is not None
    relay = Relay(app.outbox, app, asyncio.Event(), "test")
    conn = await app.outbox.connect()
    try:
        moved = 0
        while n := await relay.relay_batch(conn, fence):
            moved += n
        return moved
    finally:
        await conn.close()


# -- writing in the caller's transaction -------------------------------------------------------


async def test_committed_rows_become_one_job_each_and_rolled_back_none(setup: Setup) -> None:
    app = setup.app()
    task = _task(app)
    async with setup.conn.transaction():
        kept = await task.enqueue(Receipt(order_id=1), conn=setup.conn)
    with pytest.raises(RuntimeError):
        async with setup.conn.transaction():
            await task.enqueue(Receipt(order_id=2), conn=setup.conn)
            raise RuntimeError("the order failed")
    assert await setup.rows() == 1
    assert setup.stream_jobs() == []  # nothing reaches the broker before the relay
    assert await _relay_all(setup, app) == 1
    jobs = setup.stream_jobs()
    assert [(j["id"], j["payload"]) for j in jobs] == [(kept, {"order_id": 1})]
    assert str(jobs[0]["key"]).startswith("outbox:")
    assert await setup.rows() == 0
    await app.close()


async def test_enqueue_many_delay_priority_and_own_key_go_through(setup: Setup) -> None:
    app = setup.app()
    task = _task(app)
    async with setup.conn.transaction():
        many = await task.enqueue_many(
            [Receipt(order_id=i) for i in range(5)], conn=setup.conn, priority=0
        )
        later = await task.enqueue(Receipt(order_id=9), delay=3600, conn=setup.conn)
        keyed = await task.enqueue(Receipt(order_id=10), key="order-10", conn=setup.conn)
        again = await task.enqueue(Receipt(order_id=10), key="order-10", conn=setup.conn)
    assert await setup.rows() == 8
    assert await _relay_all(setup, app) == 8
    ids = [j["id"] for j in setup.stream_jobs()]
    assert sorted(ids) == sorted([*many, keyed])  # the second "order-10" is a duplicate
    assert again not in ids
    depth = await app.broker.depth()
    assert (depth.waiting, depth.delayed) == (6, 1)
    record = await app.job(later)
    assert record is not None and record.state == "delayed"
    await app.close()


async def test_bad_payload_writes_nothing_and_aborts_nothing_else(setup: Setup) -> None:
    app = setup.app()
    task = _task(app)
    async with setup.conn.transaction():
        with pytest.raises(ValidationError):
            await task.enqueue({"order_id": "not a number"}, conn=setup.conn)
        await task.enqueue(Receipt(order_id=3), conn=setup.conn)  # the transaction lives on
    assert await setup.rows() == 1
    await app.close()


async def test_refusals_are_one_line(setup: Setup) -> None:
    app = setup.app()
    task = _task(app)
    with pytest.raises(aqw.ConfigError, match="no open transaction"):
        await task.enqueue(Receipt(order_id=1), conn=setup.conn)
    async with setup.conn.transaction():
        with pytest.raises(aqw.ConfigError, match="debounce cannot go through the outbox"):
            await task.enqueue(Receipt(order_id=1), key="k", debounce=1, conn=setup.conn)
    with pytest.raises(
        aqw.ConfigError, match="asyncpg connection, a psycopg AsyncConnection, or an SQLAlchemy"
    ):
        await task.enqueue(Receipt(order_id=1), conn=object())
    plain = aqw.App("memory://")
    plain_task = _task(plain)
    async with setup.conn.transaction():
        with pytest.raises(aqw.ConfigError, match="the app has no outbox"):
            await plain_task.enqueue(Receipt(order_id=1), conn=setup.conn)
    with pytest.raises(aqw.ConfigError, match="postgresql:// URL"):
        aqw.App("memory://", outbox="redis://x")
    with pytest.raises(aqw.ConfigError, match="outbox schema"):
        Outbox(setup.dsn, schema="bad-name")
    assert await setup.rows() == 0
    await app.close()


async def test_missing_tables_say_how_to_make_them(setup: Setup) -> None:
    app = aqw.App(REDIS_URL, queue=setup.queue, outbox=Outbox(setup.dsn, schema="aqw_ob_absent"))
    task = _task(app)
    with pytest.raises(
        aqw.ConfigError, match='outbox tables are missing in schema "aqw_ob_absent"'
    ):
        async with setup.conn.transaction():
            await task.enqueue(Receipt(order_id=1), conn=setup.conn)
    await app.close()


async def test_psycopg_connection_writes_in_its_transaction(setup: Setup) -> None:
    app = setup.app()
    task = _task(app)
    async with await psycopg.AsyncConnection.connect(setup.dsn) as pconn:
        async with pconn.transaction():
            await task.enqueue(Receipt(order_id=1), conn=pconn)
        with pytest.raises(RuntimeError):
            async with pconn.transaction():
                await task.enqueue_many([Receipt(order_id=2)] * 3, conn=pconn)
                raise RuntimeError("rolled back")
    assert await setup.rows() == 1
    await app.close()


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg"])
@pytest.mark.parametrize("kind", ["connection", "session"])
async def test_sqlalchemy_commit_yields_one_job_rollback_none(
    setup: Setup, driver: str, kind: str
) -> None:
    app = setup.app()
    task = _task(app)
    engine = create_async_engine(setup.dsn.replace("postgresql://", f"postgresql+{driver}://", 1))
    order = sqlalchemy.text("SELECT 1")  # the caller's own statement in the same transaction
    try:
        if kind == "connection":
            async with engine.begin() as sconn:
                assert isinstance(sconn, AsyncConnection)
                await sconn.execute(order)
                kept = await task.enqueue(Receipt(order_id=1), conn=sconn)
            with pytest.raises(RuntimeError):
                async with engine.begin() as sconn:
                    await task.enqueue_many([Receipt(order_id=2)] * 3, conn=sconn)
                    raise RuntimeError("rolled back")
        else:
            async with AsyncSession(engine) as session:
                async with session.begin():
                    await session.execute(order)
                    kept = await task.enqueue(Receipt(order_id=1), conn=session)
                with pytest.raises(RuntimeError):
                    async with session.begin():
                        await task.enqueue(Receipt(order_id=2), conn=session)
                        raise RuntimeError("rolled back")
                await task.enqueue(Receipt(order_id=3), conn=session)  # autobegun, never
                await session.rollback()  # committed: gone with the rollback
    finally:
        await engine.dispose()
    assert await setup.rows() == 1
    assert await _relay_all(setup, app) == 1
    jobs = setup.stream_jobs()
    assert [(j["id"], j["payload"]) for j in jobs] == [(kept, {"order_id": 1})]
    await app.close()


async def test_sqlalchemy_autocommit_and_missing_tables_are_refused(setup: Setup) -> None:
    app = setup.app()
    task = _task(app)
    engine = create_async_engine(setup.dsn.replace("postgresql://", "postgresql+asyncpg://", 1))
    try:
        async with engine.connect() as sconn:
            auto = await sconn.execution_options(isolation_level="AUTOCOMMIT")
            with pytest.raises(aqw.ConfigError, match="AUTOCOMMIT isolation"):
                await task.enqueue(Receipt(order_id=1), conn=auto)
        absent = aqw.App(
            REDIS_URL, queue=setup.queue, outbox=Outbox(setup.dsn, schema="aqw_ob_absent")
        )
        with pytest.raises(aqw.ConfigError, match="outbox tables are missing"):
            async with engine.begin() as sconn:
                await _task(absent).enqueue(Receipt(order_id=1), conn=sconn)
        await absent.close()
    finally:
        await engine.dispose()
    assert await setup.rows() == 0
    await app.close()


async def test_migrate_is_versioned_and_idempotent(setup: Setup) -> None:
    outbox = Outbox(setup.dsn, schema=setup.schema)
    assert await outbox.migrate() == []  # the fixture applied version 1
    versions = await setup.conn.fetch(
        f'SELECT component, version FROM "{setup.schema}".aqw_migrations'
    )
    assert [(r["component"], r["version"]) for r in versions] == [("outbox", 1)]
    assert f'CREATE TABLE "{setup.schema}".aqw_outbox' in outbox.sql()


async def _relay_process(setup: Setup, mode: str) -> asyncio.subprocess.Process:
    script = str(HERE / "outbox_relay_proc.py")
    return await asyncio.create_subprocess_exec(
        *(sys.executable, script, REDIS_URL, setup.queue, setup.dsn, setup.schema, mode),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


# -- the relay ---------------------------------------------------------------------------------


async def test_stale_fence_is_refused_and_publishes_nothing(setup: Setup) -> None:
    app = setup.app()
    task = _task(app)
    async with setup.conn.transaction():
        await task.enqueue(Receipt(order_id=1), conn=setup.conn)
    assert await _relay_all(setup, app, fence=5) == 1
    async with setup.conn.transaction():
        await task.enqueue(Receipt(order_id=2), conn=setup.conn)
    with pytest.raises(LeaseLost, match="a newer relay"):
        await _relay_all(setup, app, fence=4)  # a paused ex-leader
    assert len(setup.stream_jobs()) == 1 and await setup.rows() == 1
    assert await _relay_all(setup, app, fence=5) == 1
    await app.close()


async def test_relay_killed_between_publish_and_delete_loses_none_doubles_none(
    setup: Setup,
) -> None:
    app = setup.app()
    task = _task(app)
    async with setup.conn.transaction():
        ids = await task.enqueue_many([Receipt(order_id=i) for i in range(120)], conn=setup.conn)
    proc = await _relay_process(setup, "kill-after-publish")
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == -9, err.decode()
    assert b"published 50" in out  # one batch reached Redis, then the process died
    assert len(setup.stream_jobs()) == 50
    assert await setup.rows() == 120  # its delete never committed
    assert await _relay_all(setup, app, fence=10**6) == 120  # the 50 again: duplicates
    counts = Counter(j["id"] for j in setup.stream_jobs())
    assert sorted(counts) == sorted(ids)
    assert set(counts.values()) == {1}
    assert await setup.rows() == 0
    await app.close()


async def test_worker_relays_and_runs_committed_jobs_once(setup: Setup) -> None:
    app = setup.app()
    seen: list[int] = []
    task = _task(app, seen)
    async with app.worker(concurrency=10) as worker:
        assert worker.relay is not None
        await eventually(lambda: worker.relay is not None and worker.relay.leader, 20, "leads")
        for i in range(20):
            try:
                async with setup.conn.transaction():
                    await task.enqueue(Receipt(order_id=i), conn=setup.conn)
                    if i % 3 == 0:
                        raise RuntimeError("rolled back")
            except RuntimeError:
                pass
        expected = sorted(i for i in range(20) if i % 3)
        await eventually(lambda: sorted(seen) == expected, 30, "the committed jobs ran")
    assert sorted(seen) == expected
    assert await setup.rows() == 0
    await app.close()


async def test_outbox_refused_on_a_broker_without_keyed_enqueue(setup: Setup) -> None:
    from tests.plugin_broker import PlugBroker  # an in-process broker without publish_unique

    app = aqw.App(PlugBroker("plug"), outbox=Outbox(setup.dsn, schema=setup.schema))
    _task(app)
    with pytest.raises(aqw.ConfigError, match="enqueues with an idempotency key"):
        app.worker()


async def test_concurrent_transactions_with_a_relay_sigkilled_again_and_again(
    setup: Setup,
) -> None:
    """8 producers, 10,000 transactions, a random third rolled back, while a relay process is
    SIGKILLed and restarted over and over: exactly the committed jobs reach Redis, once each."""
    app = setup.app()
    task = _task(app)
    pool = await asyncpg.create_pool(setup.dsn, min_size=8, max_size=8)
    committed: list[str] = []
    rng = random.Random(26)

    async def producer(n: int) -> None:
        for i in range(1250):
            rollback = rng.random() < 1 / 3
            async with pool.acquire() as conn:
                try:
                    async with conn.transaction():
                        job_id = await task.enqueue(Receipt(order_id=n * 1000 + i), conn=conn)
                        if rollback:
                            raise RuntimeError("rolled back")
                except RuntimeError:
                    continue
            committed.append(job_id)

    producers = asyncio.gather(*(producer(n) for n in range(8)))
    kills = 0
    try:
        while not producers.done() or (kills < 5 and await setup.rows() > 50):
            proc = await _relay_process(setup, "run")
            assert proc.stdout is not None
            # Killed once it has published a batch (so every relay did some work), at a
            # random moment after: mid-batch, between publish and delete, or idle.
            first = asyncio.ensure_future(proc.stdout.readline())
            waits = [first] if producers.done() else [first, producers]
            await asyncio.wait(waits, timeout=30, return_when="FIRST_COMPLETED")
            if first.done() and first.result().startswith(b"published"):
                await asyncio.sleep(rng.uniform(0, 0.2))
                kills += 1
            first.cancel()
            proc.kill()
            await proc.wait()
        await producers
    finally:
        await pool.close()
    await _relay_all(setup, app, fence=10**9)  # a last leader, after the last kill
    counts = Counter(j["id"] for j in setup.stream_jobs())
    assert kills >= 3
    assert len(committed) > 5000
    assert sorted(counts) == sorted(committed)
    assert set(counts.values()) == {1}
    assert await setup.rows() == 0
    await app.close()


# -- the command line --------------------------------------------------------------------------


@pytest.fixture
def app_module(setup: Setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module ``obapp_<hex>`` whose ``app`` has this test's outbox; its spec."""
    name = f"obapp_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        "import aqw\n"
        f"app = aqw.App({REDIS_URL!r}, queue={setup.queue!r}, "
        f"outbox={setup.dsn + '?schema=' + setup.schema!r})\n"
        "@app.task(name='send_receipt')\n"
        "async def send_receipt(order_id: int) -> None: ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:app"


async def test_cli_status_migrate_and_sql(
    setup: Setup, app_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from aqw.cli._main import run_command

    assert await run_command(["db", "migrate", app_module]) == 0
    assert "outbox: up to date" in capsys.readouterr().out
    assert await run_command(["outbox", "status", app_module, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"pending": 0, "oldest_age": 0.0}
    await setup.conn.execute(
        f'INSERT INTO "{setup.schema}".aqw_outbox (queue, job, created_at) '
        "VALUES ($1, $2, now() - interval '1 hour')",
        setup.queue,
        b"{}",
    )
    assert await run_command(["outbox", "status", app_module, "--max-age", "60"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("1 rows not relayed, oldest 3")  # about 3600 s
    assert await run_command(["db", "sql", "--schema", "elsewhere"]) == 0
    sql = capsys.readouterr().out
    assert 'CREATE TABLE "elsewhere".aqw_outbox' in sql
    assert (
        "INSERT INTO \"elsewhere\".aqw_migrations (component, version) VALUES ('outbox', 1)" in sql
    )
    assert await run_command(["db", "sql", "--broker-tables", "--schema", "s2"]) == 0
    sql = capsys.readouterr().out
    assert 'CREATE TABLE "s2".aqw_jobs' in sql and "VALUES ('broker', 2)" in sql


async def test_db_sql_applied_by_hand_then_migrate_finds_nothing_to_do(setup: Setup) -> None:
    schema = f"aqw_ob_{uuid.uuid4().hex[:10]}"
    try:
        await setup.conn.execute(Outbox(setup.dsn, schema=schema).sql())
        assert await Outbox(setup.dsn, schema=schema).migrate() == []
    finally:
        await setup.conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def test_cli_relay_runs_until_stopped(
    setup: Setup, app_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    app = setup.app()
    task = _task(app)
    async with setup.conn.transaction():
        await task.enqueue_many([Receipt(order_id=i) for i in range(3)], conn=setup.conn)
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "aqw", "outbox", "relay", app_module),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    await eventually(lambda: len(setup.stream_jobs()) == 3, 30, "relayed", procs=[proc])
    proc.send_signal(signal.SIGTERM)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    assert b"relayed 3 rows" in out
    await app.close()
