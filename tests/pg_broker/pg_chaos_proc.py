"""A worker process on the PostgreSQL broker for the chaos run (``test_chaos.py``):

    python pg_chaos_proc.py URL LEDGER

Each job ``n`` sleeps a little, then writes its effect, a row ``(n, kind)`` in LEDGER (no
unique constraint: a double shows), once: an even ``n`` under ``ctx.effect`` (the completion
row commits in the write's transaction, fenced by the lease), an odd one in
``ctx.transaction()`` (the write and the job's ack commit together, the ack fenced by the
lease's token). A write the fence refuses prints ``REFUSED <n>`` on stdout (the test reads
the paused worker's); an effect found already written prints ``DONE-BEFORE <n>``. The
write is shielded from the worker's cancel at a lost lease (below), so a resumed holder
really tries it."""

from __future__ import annotations

import asyncio
import signal
import sys

import asyncpg

import aqw
from aqw.idempotency import SqlCompletionStore

LEASE_TTL = 2.0


async def main(url: str, ledger: str) -> None:
    app = aqw.App(url, lease_ttl=LEASE_TTL)
    store = SqlCompletionStore(f"{ledger}_completions")
    # min_size=0: no connection at start (a worker started during the restart waits for one)
    pool = await asyncpg.create_pool(url.split("?")[0], min_size=0, max_size=12)

    def say(word: str, n: int) -> None:
        print(word, n, flush=True)

    async def write(n: int, ctx: aqw.Context) -> None:
        await asyncio.sleep(0.02)  # a holder is most often here: a pause lands before its write
        try:
            if n % 2 == 0:
                async with (
                    pool.acquire() as conn,
                    conn.transaction(),
                    ctx.effect(conn, store, key=f"n:{n}") as first_time,
                ):
                    if first_time:
                        await conn.execute(f"INSERT INTO {ledger} VALUES ($1, 'effect')", n)
                    else:
                        say("DONE-BEFORE", n)
            else:
                async with ctx.transaction() as conn:
                    await conn.execute(f"INSERT INTO {ledger} VALUES ($1, 'transaction')", n)
        except aqw.LeaseLost:
            say("REFUSED", n)
            raise

    @app.task(name="effect")
    async def effect(n: int, ctx: aqw.Context) -> None:
        # Shielded from the worker's own cancel at a lost lease: the write goes on as if the
        # pause had landed past every check of the holder's own, so only the fence (the
        # effect's lease and token checks, the transaction's ack checking the lease's token
        # on the server) stands between a resumed ex-holder and a second write.
        await asyncio.shield(write(n, ctx))

    def dump_tasks() -> None:  # SIGUSR1: where every task waits (the test asks when stuck)
        for task in asyncio.all_tasks():
            task.print_stack(limit=12, file=sys.stdout)
        sys.stdout.flush()

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump_tasks)
    await app.worker(concurrency=10).run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
