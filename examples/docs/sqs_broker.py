"""The SQS broker: visibility as the lease, retries through visibility, a dead-letter queue.

Set AQW_SQS_ENDPOINT to an SQS-compatible endpoint (http://127.0.0.1:PORT), or leave it unset
to use AWS with your usual credentials. The queues are created (create=1) and deleted.
"""

import asyncio
import os
import uuid

import aioboto3

import aqw

ENDPOINT = os.environ.get("AQW_SQS_ENDPOINT")
REGION = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
NAME = f"docs-{uuid.uuid4().hex[:8]}"

url = f"sqs://{NAME}?region={REGION}&create=1&dlq={NAME}-dead&visibility=30"
if ENDPOINT:
    url += f"&endpoint_url={ENDPOINT}"
app = aqw.App(url, retry=aqw.RetryPolicy(max_retries=3, base=0.5))


@app.task
async def sync_invoice(invoice_id: int, ctx: aqw.Context) -> None:
    # On SQS every receive is an attempt: ctx.attempt is the message's receive count.
    if ctx.attempt == 1:
        raise ConnectionError("ledger API unavailable")  # hidden for the backoff, then back


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
        dead = await app.dlq.list()
        print("dead-letter queue:", [(d.task, d.error_type, d.error) for d in dead])
    finally:
        await app.close()
        async with aioboto3.Session().client(
            "sqs", region_name=REGION, endpoint_url=ENDPOINT
        ) as sqs:
            for name in (NAME, f"{NAME}-dead"):
                queue_url = (await sqs.get_queue_url(QueueName=name))["QueueUrl"]
                await sqs.delete_queue(QueueUrl=queue_url)


if __name__ == "__main__":
    asyncio.run(main())
