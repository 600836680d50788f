"""The SQL completion store against the real PostgreSQL (``AQW_TEST_PG_DSN``, by default database
``test`` on 127.0.0.1:5432).

Every test works in its own tables (``aqw_t<run>_<n>_*``), dropped at its end; Redis keys go
under ``aqw:{t-<hex>}:*`` and are deleted at the end. PostgreSQL or Redis not answering is a
FAILURE with a clear message, never a skip.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import redis
from redis.asyncio import Redis

import aqw
from aqw.brokers.memory import MemoryBroker
from aqw.brokers.redis import RedisBroker
from aqw.idempotency import SqlCompletionStore, context_effect
from tests._helpers import PG_DSNS, REDIS_URL, eventually, pg_where, require_real_redis

pytestmark = pytest.mark.timeout(60)

RUN = uuid.uuid4().hex[:8]
_tables = itertools.count()
HERE = Path(__file__).resolve().parent

# -- fixtures -------------------------------------------------------------------------------


async def _find_dsn() -> str:
    errors = []
    for dsn in PG_DSNS:
        try:
            conn = await asyncpg.connect(dsn, timeout=5)
        except Exception as exc:
            errors.append(f"{urllib.parse.urlsplit(dsn).username}: {exc!r}")
            continue
        await conn.close()
        return dsn
    pytest.fail(
        f"PostgreSQL at {pg_where(PG_DSNS[0])} is not answering (AQW_TEST_PG_DSN): "
        f"{'; '.join(errors)}. The SQL completion store tests need it (CI starts one); they fail "
        "rather than skip.",
        pytrace=False,
    )


@pytest.fixture
async def dsn() -> str:
    return await _find_dsn()


@dataclass
class Sql:
    """One test's tables: the store, and an ``effects`` table without any unique constraint
    (so a second write of an effect shows up as a second row)."""

    dsn: str
    store: SqlCompletionStore
    effects: str
    conn: asyncpg.Connection

    async def effect_rows(self) -> list[tuple[str, str]]:
        rows = await self.conn.fetch(f"SELECT job_id, key FROM {self.effects} ORDER BY job_id")
        return [(r["job_id"], r["key"]) for r in rows]

    async def completions(self) -> int:
        return int(await self.conn.fetchval(f"SELECT count(*) FROM {self.store.table}"))

    async def write_effect(self, conn: Any, job_id: str, key: str, writer: str = "") -> None:
        await conn.execute(
            f"INSERT INTO {self.effects} (job_id, key, writer) VALUES ($1, $2, $3)",
            job_id,
            key,
            writer,
        )


@pytest.fixture
async def sql(dsn: str) -> AsyncIterator[Sql]:
    prefix = f"aqw_t{RUN}_{next(_tables)}"
    store = SqlCompletionStore(f"{prefix}_completions")
    effects = f"{prefix}_effects"
    conn = await asyncpg.connect(dsn)
    try:
        await store.ensure_schema(conn)
        await conn.execute(
            f"CREATE TABLE {effects} (job_id text NOT NULL, key text NOT NULL,"
            " writer text NOT NULL DEFAULT '', at timestamptz NOT NULL DEFAULT now())"
        )
        yield Sql(dsn, store, effects, conn)
    finally:
        await store.drop_schema(conn)
        await conn.execute(f"DROP TABLE IF EXISTS {effects}")
        await conn.close()


@pytest.fixture
def queue() -> Iterator[str]:
    """A unique queue name on the real Redis; its ``aqw:{queue}:*`` keys go at the end."""
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


# -- effect(): unit tests --------------------------------------------------------------------


async def test_first_time_true_then_false_and_one_row(sql: Sql) -> None:
    seen = []
    for attempt in range(3):
        async with (
            sql.conn.transaction(),
            sql.store.effect(
                sql.conn, queue="q", key="k1", job_id="j1", fencing_token=7 + attempt
            ) as first_time,
        ):
            seen.append(first_time)
            if first_time:
                await sql.write_effect(sql.conn, "j1", "k1")
    assert seen == [True, False, False]
    assert await sql.effect_rows() == [("j1", "k1")]
    assert await sql.completions() == 1
    row = await sql.store.completion(sql.conn, queue="q", key="k1")
    assert row is not None
    assert (row["job_id"], row["fencing_token"]) == ("j1", 7)
    assert await sql.store.is_completed(sql.conn, queue="q", key="k1")
    assert not await sql.store.is_completed(sql.conn, queue="other", key="k1")


async def test_same_key_on_another_queue_is_another_effect(sql: Sql) -> None:
    for q in ("a", "b"):
        async with (
            sql.conn.transaction(),
            sql.store.effect(
                sql.conn, queue=q, key="k", job_id=f"j-{q}", fencing_token=1
            ) as first_time,
        ):
            assert first_time
    assert await sql.completions() == 2


async def test_the_same_holder_may_enter_twice(sql: Sql) -> None:
    """Equal fencing tokens are the same holder (tokens are unique per acquisition)."""
    async with sql.conn.transaction():
        async with sql.store.effect(
            sql.conn, queue="q", key="k", job_id="j", fencing_token=5
        ) as first:
            assert first
        async with sql.store.effect(
            sql.conn, queue="q", key="k", job_id="j", fencing_token=5
        ) as again:
            assert not again


async def test_rollback_of_the_callers_transaction_removes_the_record(sql: Sql) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        async with sql.conn.transaction():
            async with sql.store.effect(
                sql.conn, queue="q", key="k", job_id="j1", fencing_token=1
            ) as first_time:
                assert first_time
                await sql.write_effect(sql.conn, "j1", "k")
            raise Boom  # after the effect block, before the commit
    assert await sql.completions() == 0
    assert await sql.effect_rows() == []
    # so the effect is still to be done: the next holder does it
    async with (
        sql.conn.transaction(),
        sql.store.effect(sql.conn, queue="q", key="k", job_id="j1", fencing_token=2) as first_time,
    ):
        assert first_time
        await sql.write_effect(sql.conn, "j1", "k")
    assert await sql.effect_rows() == [("j1", "k")]


async def test_an_error_in_the_block_keeps_no_record_even_if_the_caller_commits(sql: Sql) -> None:
    async with sql.conn.transaction():
        await sql.write_effect(sql.conn, "other", "before")  # the caller's own write
        with pytest.raises(ZeroDivisionError):
            async with sql.store.effect(
                sql.conn, queue="q", key="k", job_id="j", fencing_token=1
            ) as first_time:
                assert first_time
                await sql.write_effect(sql.conn, "j", "k")
                _ = 1 / 0
    # the savepoint rolled back the record and the block's write, not the caller's write
    assert await sql.completions() == 0
    assert await sql.effect_rows() == [("other", "before")]


async def test_without_an_open_transaction_the_block_is_its_own(sql: Sql) -> None:
    assert not sql.conn.is_in_transaction()
    async with sql.store.effect(
        sql.conn, queue="q", key="k", job_id="j", fencing_token=1
    ) as first_time:
        assert sql.conn.is_in_transaction()
        assert first_time
        await sql.write_effect(sql.conn, "j", "k")
    assert not sql.conn.is_in_transaction()
    assert await sql.completions() == 1
    with pytest.raises(KeyError):
        async with sql.store.effect(
            sql.conn, queue="q", key="k2", job_id="j2", fencing_token=1
        ) as first_time:
            await sql.write_effect(sql.conn, "j2", "k2")
            raise KeyError("boom")
    assert await sql.effect_rows() == [("j", "k")]
    assert await sql.completions() == 1


async def test_a_stale_fencing_token_raises_lease_lost_and_writes_nothing(sql: Sql) -> None:
    async with (
        sql.conn.transaction(),
        sql.store.effect(sql.conn, queue="q", key="k", job_id="j", fencing_token=10) as first_time,
    ):
        assert first_time
        await sql.write_effect(sql.conn, "j", "k", "new")
    ran = False
    with pytest.raises(aqw.LeaseLost, match=r"fencing token 9 is stale.*token 10"):
        async with sql.conn.transaction():
            await sql.write_effect(sql.conn, "j", "k", "stale-before")  # aborted with it
            async with sql.store.effect(sql.conn, queue="q", key="k", job_id="j", fencing_token=9):
                ran = True
    assert not ran
    assert await sql.effect_rows() == [("j", "k")]
    row = await sql.store.completion(sql.conn, queue="q", key="k")
    assert row is not None and row["fencing_token"] == 10
    # stale even when the newer holder's effect has not been recorded (only its fence)
    async with (
        sql.conn.transaction(),
        sql.store.effect(
            sql.conn, queue="q", key="k2", job_id="j2", fencing_token=20
        ) as first_time,
    ):
        assert first_time
        await sql.write_effect(sql.conn, "j2", "k2")
    with pytest.raises(aqw.LeaseLost):
        async with (
            sql.conn.transaction(),
            sql.store.effect(
                sql.conn, queue="q", key="k2", job_id="j2", fencing_token=3
            ) as first_time,
        ):
            await sql.write_effect(sql.conn, "j2", "k2", "stale")
    assert await sql.effect_rows() == [("j", "k"), ("j2", "k2")]


async def test_check_fence_false_skips_the_fence_but_not_the_record(sql: Sql) -> None:
    async with sql.store.effect(sql.conn, queue="q", key="k", job_id="j", fencing_token=10):
        pass
    async with sql.store.effect(
        sql.conn, queue="q", key="k", job_id="j", fencing_token=1, check_fence=False
    ) as first_time:
        assert not first_time


async def test_a_stale_holder_waits_for_the_newer_one_and_is_refused(sql: Sql) -> None:
    """Holder 10 is inside its block (fence row locked); holder 9 blocks on it, then fails."""
    other = await asyncpg.connect(sql.dsn)
    try:
        newer_inside, release = asyncio.Event(), asyncio.Event()

        async def newer() -> None:
            async with (
                sql.conn.transaction(),
                sql.store.effect(
                    sql.conn, queue="q", key="k", job_id="j", fencing_token=10
                ) as first_time,
            ):
                assert first_time
                await sql.write_effect(sql.conn, "j", "k", "newer")
                newer_inside.set()
                await release.wait()

        async def stale() -> str:
            await newer_inside.wait()
            try:
                async with (
                    other.transaction(),
                    sql.store.effect(
                        other, queue="q", key="k", job_id="j", fencing_token=9
                    ) as first_time,
                ):
                    if first_time:
                        await sql.write_effect(other, "j", "k", "stale")
                    return "passed"
            except aqw.LeaseLost:
                return "lease lost"

        task = asyncio.ensure_future(stale())
        newer_task = asyncio.ensure_future(newer())
        await newer_inside.wait()
        await asyncio.sleep(0.2)
        assert not task.done(), "the stale holder should wait on the newer holder's row lock"
        release.set()
        await newer_task
        assert await task == "lease lost"
        rows = await sql.conn.fetch(f"SELECT writer FROM {sql.effects}")
        assert [r["writer"] for r in rows] == ["newer"]
    finally:
        await other.close()


async def test_an_older_holder_that_commits_first_leaves_the_newer_nothing_to_do(sql: Sql) -> None:
    """Holder 9 enters first; holder 10 waits, then finds the effect done (True once)."""
    other = await asyncpg.connect(sql.dsn)
    try:
        older_inside, release = asyncio.Event(), asyncio.Event()
        results: dict[str, bool] = {}

        async def older() -> None:
            async with (
                sql.conn.transaction(),
                sql.store.effect(
                    sql.conn, queue="q", key="k", job_id="j", fencing_token=9
                ) as first_time,
            ):
                results["older"] = first_time
                await sql.write_effect(sql.conn, "j", "k", "older")
                older_inside.set()
                await release.wait()

        async def newer() -> None:
            await older_inside.wait()
            async with (
                other.transaction(),
                sql.store.effect(
                    other, queue="q", key="k", job_id="j", fencing_token=10
                ) as first_time,
            ):
                results["newer"] = first_time
                if first_time:
                    await sql.write_effect(other, "j", "k", "newer")

        tasks = [asyncio.ensure_future(older()), asyncio.ensure_future(newer())]
        await older_inside.wait()
        await asyncio.sleep(0.2)
        assert "newer" not in results
        release.set()
        await asyncio.gather(*tasks)
        assert results == {"older": True, "newer": False}
        assert len(await sql.effect_rows()) == 1
    finally:
        await other.close()


async def test_arguments_are_checked(sql: Sql) -> None:
    with pytest.raises(aqw.ConfigError):
        sql.store.effect(sql.conn, queue="q", key="", job_id="j", fencing_token=1)
    with pytest.raises(aqw.ConfigError):
        sql.store.effect(sql.conn, queue="q", key="k", job_id="j", fencing_token=-1)
    with pytest.raises(aqw.ConfigError):
        SqlCompletionStore('x"; DROP TABLE users; --')
    assert SqlCompletionStore().fence_table == "aqw_fences"
    assert SqlCompletionStore("s.jobs_done").fence_table == "s.jobs_done_fences"


async def test_ensure_schema_is_idempotent_and_safe_concurrently(sql: Sql) -> None:
    store = SqlCompletionStore(f"aqw_t{RUN}_concurrent_completions")
    conns = [await asyncpg.connect(sql.dsn) for _ in range(4)]
    try:
        await asyncio.gather(*(store.ensure_schema(c) for c in conns))
        await store.ensure_schema(conns[0])
        async with store.effect(conns[0], queue="q", key="k", job_id="j", fencing_token=1) as f:
            assert f
    finally:
        await store.drop_schema(conns[0])
        for c in conns:
            await c.close()


async def test_purge_removes_old_rows(sql: Sql) -> None:
    for key in ("old", "new"):
        async with sql.store.effect(sql.conn, queue="q", key=key, job_id="j", fencing_token=1):
            pass
    await sql.conn.execute(
        f"UPDATE {sql.store.table} SET completed_at = now() - interval '2 hours' WHERE key='old'"
    )
    assert await sql.store.purge(sql.conn, 3600) == 1
    assert not await sql.store.is_completed(sql.conn, queue="q", key="old")
    assert await sql.store.is_completed(sql.conn, queue="q", key="new")


# -- leases: a holder that lost its lease cannot commit ----------------------------------------


async def test_a_lease_paused_past_its_ttl_cannot_commit(sql: Sql, queue: str) -> None:
    """Holder A takes the lease, then its renewals stall (the process is paused) past the TTL.
    Holder B takes the lease (a higher fencing token) and commits the effect. A wakes up and
    tries to commit: LeaseLost, whether it still trusts its Lease object or only its token."""
    client = Redis.from_url(REDIS_URL)
    try:
        key = f"aqw:{{{queue}}}:lock:order-1"
        a = aqw.Lease(client, key, ttl=0.3)
        await a.acquire()  # held, but no renewal runs: the pause
        await asyncio.sleep(0.45)
        # No renewal has reported anything, but the confirmed expiry has passed: not held.
        assert a.lost_reason is None and not a.held
        b = aqw.Lease(client, key, ttl=5.0)
        async with b:
            assert b.fencing_token > a.fencing_token
            async with (
                sql.conn.transaction(),
                sql.store.effect(
                    sql.conn,
                    queue=queue,
                    key="order-1",
                    job_id="job",
                    fencing_token=b.fencing_token,
                    lease=b,
                ) as first_time,
            ):
                assert first_time
                await sql.write_effect(sql.conn, "job", "order-1", "B")
        for lease in (a, None):  # A's own Lease object, or only its token (fence check)
            with pytest.raises(aqw.LeaseLost):
                async with (
                    sql.conn.transaction(),
                    sql.store.effect(
                        sql.conn,
                        queue=queue,
                        key="order-1",
                        job_id="job",
                        fencing_token=a.fencing_token,
                        lease=lease,
                    ) as first_time,
                ):
                    await sql.write_effect(sql.conn, "job", "order-1", "A")
        rows = await sql.conn.fetch(f"SELECT writer FROM {sql.effects}")
        assert [r["writer"] for r in rows] == ["B"]
        await a.release()  # compare-token-then-DEL: does not touch B's (released) key
    finally:
        await client.aclose()


async def test_a_lease_past_its_ttl_cannot_commit_before_the_new_holder_writes(
    sql: Sql, queue: str
) -> None:
    """The new holder has only taken the lease; the fence table cannot know yet, but the
    paused holder's own lease check refuses, so the new holder then does the effect once."""
    client = Redis.from_url(REDIS_URL)
    try:
        key = f"aqw:{{{queue}}}:lock:order-2"
        a = aqw.Lease(client, key, ttl=0.3)
        await a.acquire()
        await asyncio.sleep(0.4)
        async with aqw.Lease(client, key, ttl=5.0) as b:
            with pytest.raises(aqw.LeaseLost, match="past its confirmed expiry"):
                async with (
                    sql.conn.transaction(),
                    sql.store.effect(
                        sql.conn,
                        queue=queue,
                        key="order-2",
                        job_id="job",
                        fencing_token=a.fencing_token,
                        lease=a,
                    ),
                ):
                    await sql.write_effect(sql.conn, "job", "order-2", "A")
            assert await sql.effect_rows() == []
            async with sql.store.effect(
                sql.conn,
                queue=queue,
                key="order-2",
                job_id="job",
                fencing_token=b.fencing_token,
                lease=b,
            ) as first_time:
                assert first_time
                await sql.write_effect(sql.conn, "job", "order-2", "B")
        assert await sql.effect_rows() == [("job", "order-2")]
    finally:
        await client.aclose()


async def test_a_lease_lost_inside_the_block_keeps_nothing(sql: Sql, queue: str) -> None:
    """The whole stack: a renewed lease, the event loop frozen past the TTL (a GC pause),
    another holder takes the key meanwhile; the block is cancelled or refused, nothing is kept."""
    client = Redis.from_url(REDIS_URL)
    sync = redis.Redis.from_url(REDIS_URL)
    try:
        key = f"aqw:{{{queue}}}:lock:order-3"
        with pytest.raises(aqw.LeaseLost):
            async with aqw.Lease(client, key, ttl=0.3) as a, sql.conn.transaction():
                effect = sql.store.effect(
                    sql.conn,
                    queue=queue,
                    key="order-3",
                    job_id="job",
                    fencing_token=a.fencing_token,
                    lease=a,
                )
                async with effect as first_time:
                    assert first_time
                    await sql.write_effect(sql.conn, "job", "order-3", "A")
                    time.sleep(0.45)  # noqa: ASYNC251 -- the pause: nothing runs, the lease expires
                    assert sync.set(key, "someone-else", nx=True, px=5000)
                    await asyncio.sleep(0.2)  # A's renewal is refused; the block is cut
        assert await sql.effect_rows() == []
        assert await sql.completions() == 0
    finally:
        await client.aclose()
        sync.close()


# -- the runtime ---------------------------------------------------------------------------------


async def test_context_effect_fills_queue_key_job_and_token(sql: Sql) -> None:
    app = aqw.App(MemoryBroker(f"t-{uuid.uuid4().hex[:8]}"))
    pool = await asyncpg.create_pool(sql.dsn, min_size=1, max_size=2)
    seen: dict[str, tuple[int, bool]] = {}

    @app.task(name="pay")
    async def pay(n: int, ctx: aqw.Context) -> None:
        async with pool.acquire() as conn, conn.transaction():
            async with context_effect(ctx, conn, sql.store) as first_time:
                seen[ctx.job.id] = (ctx.fencing_token, first_time)
                if first_time:
                    await sql.write_effect(conn, ctx.job.id, ctx.job.key or ctx.job.id)
            async with context_effect(ctx, conn, sql.store, key=f"{ctx.job.id}:mail") as first:
                assert first

    try:
        keyed = await pay.enqueue(1, key="pay:1")
        plain = await pay.enqueue(2)
        worker = app.worker(burst=True)
        await asyncio.wait_for(worker.run(), 10)
        assert worker.stats.processed == 2
        assert all(token > 0 and first for token, first in seen.values())
        for job_id, key in [(keyed, "pay:1"), (plain, plain)]:
            token = seen[job_id][0]
            row = await sql.store.completion(sql.conn, queue=app.queue, key=key)
            assert row is not None
            assert (row["job_id"], row["fencing_token"]) == (job_id, token)
        assert await sql.completions() == 4
    finally:
        await pool.close()


def _start_crasher(queue: str, sql: Sql, lease_ttl: float) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [
            sys.executable,
            str(HERE / "sql_worker.py"),
            REDIS_URL,
            queue,
            sql.dsn,
            sql.store.table,
            sql.effects,
            str(lease_ttl),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _kill(proc: subprocess.Popen[str]) -> str:
    """SIGKILL the worker (no goodbye: no ack, no release) and return its stderr."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=10)
    return err


@pytest.mark.xdist_group("processes")  # see CONTRIBUTING.md: one at a time
async def test_four_workers_and_a_forced_redelivery_of_every_job_each_effect_once(
    sql: Sql, queue: str
) -> None:
    """200 keyed jobs. A worker process commits every job's effect and is SIGKILLed before
    any ack (the crash between commit and ack); every envelope is also XADDed a second time.
    Four workers then get every job again (reclaimed and duplicated): each job's handler runs
    again, finds its effect done, writes nothing. Exactly one effect row per job."""
    n, ttl = 200, 1.0
    producer = aqw.App(RedisBroker(REDIS_URL, queue), lease_ttl=ttl)

    @producer.task(name="charge")
    async def _charge(n: int) -> None: ...

    ids = [await _charge.enqueue(i, key=f"order:{i}") for i in range(n)]
    assert len(set(ids)) == n and not any(i.duplicate for i in ids)

    # phase 1: the crasher commits every effect, then is killed before acking anything
    proc = _start_crasher(queue, sql, ttl)
    try:
        await eventually(
            lambda: _crasher_committed(proc, sql, n), 30, "the crashing worker to commit all"
        )
    finally:
        _kill(proc)
    assert await sql.completions() == n

    # every job is still pending in the stream (no ack happened): deliver each a second time
    raw = Redis.from_url(REDIS_URL)
    workers: list[aqw.Worker] = []
    apps: list[aqw.App] = []
    try:
        keys = RedisBroker(raw, queue).keys
        entries: Any = await raw.xrange(keys.stream)
        assert len(entries) == n
        pending = await raw.xpending(keys.stream, "aqw")
        assert pending["pending"] == n
        pipe = raw.pipeline(transaction=False)
        for _, fields in entries:
            pipe.xadd(keys.stream, {"j": fields[b"j"]})
        await pipe.execute()

        # phase 2: four workers, one process, one queue
        pool = await asyncpg.create_pool(sql.dsn, min_size=4, max_size=20)
        runs: list[tuple[str, bool]] = []

        def make_app(writer: str) -> aqw.App:
            app = aqw.App(RedisBroker(REDIS_URL, queue), lease_ttl=ttl)

            @app.task(name="charge")
            async def charge(n: int, ctx: aqw.Context) -> None:
                await asyncio.sleep(random.uniform(0, 0.005))
                async with (
                    pool.acquire() as conn,
                    conn.transaction(),
                    context_effect(ctx, conn, sql.store) as first_time,
                ):
                    runs.append((ctx.job.id, first_time))
                    if first_time:
                        await sql.write_effect(conn, ctx.job.id, ctx.job.key or "", writer)

            return app

        apps.extend(make_app(f"w{w}") for w in range(4))
        try:
            for app in apps:
                worker = app.worker(concurrency=50)
                await worker.start()
                workers.append(worker)
            await eventually(
                lambda: _stream_empty(raw, keys.stream), 30, "every entry to be acknowledged"
            )
        finally:
            for worker in workers:
                await worker.stop(grace=5)
            await pool.close()

        # exactly one effect per job, all written before the crash, none by the redelivery
        rows = await sql.conn.fetch(f"SELECT job_id, writer FROM {sql.effects}")
        per_job = Counter(r["job_id"] for r in rows)
        assert len(rows) == n
        assert set(per_job) == set(ids) and set(per_job.values()) == {1}
        assert {r["writer"] for r in rows} == {"crasher"}
        assert await sql.completions() == n
        # every job really ran again in phase 2 (no ack had written a done record), and
        # every one of those runs found its effect already committed
        assert {job_id for job_id, _ in runs} == set(ids)
        assert not any(first for _, first in runs)
        total = Counter[str]()
        for worker in workers:
            total.update(worker.stats.as_dict())
        # each job's second copy is skipped after its start (the completion record) or
        # refused at it (the first copy's ack had ended the record: a stale start); on a
        # busy machine a copy held past the 1 s lease before its start is reclaimed by
        # another worker and refused by both, so a copy can count twice, never zero times
        skipped = total["duplicates_skipped"] + total["stale_starts"]
        assert total["processed"] >= n and skipped >= n, total
        assert total["dead"] == 0 and total["failed"] == 0, total
    finally:
        for app in [producer, *apps]:
            await app.close()
        await raw.aclose()


@pytest.mark.xdist_group("processes")  # see CONTRIBUTING.md: one at a time
async def test_two_jobs_with_one_key_race_on_four_workers_one_effect(sql: Sql, queue: str) -> None:
    """Two different jobs per key (published around the enqueue dedup, as after its record
    expired) run at the same time on four workers: the SQL record and fence decide, so each
    key's effect is written once; a loser refused by the fence is retried and then finds the
    effect done."""
    keys_n = 100
    pool = await asyncpg.create_pool(sql.dsn, min_size=4, max_size=20)
    apps: list[aqw.App] = []
    workers: list[aqw.Worker] = []
    outcomes: Counter[str] = Counter()
    fast = aqw.RetryPolicy(max_retries=5, base=0.01, cap=0.05)
    raw = Redis.from_url(REDIS_URL)
    try:
        for _ in range(4):
            app = aqw.App(RedisBroker(REDIS_URL, queue), lease_ttl=2.0, retry=fast)

            @app.task(name="ship")
            async def ship(n: int, ctx: aqw.Context) -> None:
                try:
                    async with (
                        pool.acquire() as conn,
                        conn.transaction(),
                        context_effect(ctx, conn, sql.store) as first_time,
                    ):
                        outcomes["first" if first_time else "again"] += 1
                        if first_time:
                            await sql.write_effect(conn, ctx.job.id, ctx.job.key or "")
                        await asyncio.sleep(random.uniform(0, 0.01))
                except aqw.LeaseLost:
                    outcomes["fenced"] += 1
                    raise

            apps.append(app)
        jobs = [
            aqw.Job(task="ship", payload=i, key=f"ship:{i}") for i in range(keys_n) for _ in (0, 1)
        ]
        random.shuffle(jobs)
        await apps[0].broker.publish(jobs)
        for app in apps:
            worker = app.worker(concurrency=40)
            await worker.start()
            workers.append(worker)
        await eventually(lambda: _queue_empty(raw, queue), 30, "every job and retry to settle")
    finally:
        for worker in workers:
            await worker.stop(grace=5)
        await pool.close()
        for app in apps:
            await app.close()
        await raw.aclose()
    rows = await sql.effect_rows()
    assert len(rows) == keys_n
    assert Counter(key for _, key in rows) == Counter(f"ship:{i}" for i in range(keys_n))
    assert await sql.completions() == keys_n
    assert outcomes["first"] == keys_n
    assert sum(w.stats.dead for w in workers) == 0


async def _crasher_committed(proc: subprocess.Popen[str], sql: Sql, n: int) -> bool:
    if proc.poll() is not None:
        out, err = proc.communicate()
        raise AssertionError(f"the crashing worker exited ({proc.returncode}):\n{out}\n{err}")
    effects = int(await sql.conn.fetchval(f"SELECT count(*) FROM {sql.effects}"))
    return effects >= n and await sql.completions() >= n


async def _stream_empty(raw: Redis, stream: str) -> bool:
    return int(await raw.xlen(stream)) == 0


async def _queue_empty(raw: Redis, queue: str) -> bool:
    """Stream and delayed set both empty, read atomically (a retry moves a job from one to
    the other in one step, so two separate reads could miss it)."""
    pipe = raw.pipeline(transaction=True)
    pipe.xlen(f"aqw:{{{queue}}}:stream")
    pipe.zcard(f"aqw:{{{queue}}}:delayed")
    length, delayed = await pipe.execute()
    return int(length) == 0 and int(delayed) == 0
