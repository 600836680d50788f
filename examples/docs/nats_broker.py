"""The NATS JetStream broker: the ack window as the lease, a KV revision as the fencing
token, retries through the delayed stream, a dead-letter stream.

Set AQW_NATS_URL to a JetStream server (default nats://127.0.0.1:4222). The queue's streams
and buckets are created on connect and deleted at the end.
"""

import asyncio
import os
import uuid

import nats

import aqw

URL = os.environ.get("AQW_NATS_URL", "nats://127.0.0.1:4222")
QUEUE = f"docs-{uuid.uuid4().hex[:8]}"

app = aqw.App(f"{URL}?queue={QUEUE}", retry=aqw.RetryPolicy(max_retries=3, base=0.2))
tokens: list[int] = []


@app.task
async def sync_invoice(invoice_id: int, ctx: aqw.Context) -> None:
    tokens.append(ctx.fencing_token)  # the revision of the job's lease key: it only grows
    if ctx.attempt == 1:
        raise ConnectionError("ledger API unavailable")  # retried as attempt 2 after its backoff


@app.task
async def void_invoice(invoice_id: int) -> None:
    raise aqw.Reject("invoices cannot be voided after export")


async def main() -> None:
    try:
        await sync_invoice.enqueue(1)
        await void_invoice.enqueue(2)
        worker = app.worker(concurrency=4, burst=True)
        await worker.run()
        print(
            f"processed={worker.stats.processed} retried={worker.stats.retried} "
            f"dead={worker.stats.dead}"
        )
        assert (worker.stats.processed, worker.stats.retried, worker.stats.dead) == (1, 1, 1)
        assert tokens[0] < tokens[1], tokens
        print("fencing tokens of the two attempts grow:", tokens[0] < tokens[1])
        dead = await app.dlq.list()
        print("dead-letter stream:", [(d.task, d.error_type, d.error) for d in dead])
        print("depth:", (await app.broker.depth()).as_dict())
    finally:
        await app.close()
        nc = await nats.connect(URL)
        js = nc.jetstream()
        for stream in ("", "_DELAYED", "_DLQ"):
            await js.delete_stream(f"AQW_{QUEUE}{stream}")
        for bucket in ("LEASES", "KEYS", "STATE", "RECORDS", "DEPTH"):
            await js.delete_key_value(f"AQW_{QUEUE}_{bucket}")
        await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
