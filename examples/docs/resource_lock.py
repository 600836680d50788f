"""ctx.lock: a renewed, fenced lease on a resource, shared by every worker of the queue."""

import asyncio

import aqw

app = aqw.App("memory://", queue="ledger")  # on Redis the lock is aqw:{ledger}:lock:<name>
balance = {"account:7": 100}
tokens: list[int] = []


@app.task
async def debit(account: str, cents: int, ctx: aqw.Context) -> None:
    # Jobs of one account take turns; other accounts are not held up. A job waits up to
    # `wait` seconds for the lock, then fails with LeaseUnavailable (and is retried).
    async with ctx.lock(account, ttl=10.0, wait=5.0) as lock:
        current = balance[account]  # read-modify-write, safe under the lock
        await asyncio.sleep(0.01)
        balance[account] = current - cents
        tokens.append(lock.fencing_token)  # pass it to the datastore with the write


async def main() -> None:
    for _ in range(10):
        await debit.enqueue({"account": "account:7", "cents": 5})
    worker = app.worker(concurrency=10, burst=True)  # ten jobs at once, one lock
    await worker.run()
    print("balance", balance, "fencing tokens", tokens)
    assert balance["account:7"] == 50 and tokens == sorted(tokens)
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
