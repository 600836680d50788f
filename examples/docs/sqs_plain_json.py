"""Consume plain JSON that another producer (not aqw) sends to an SQS queue.

With ``task=NAME`` in the sqs:// URL, a message body that is not an aqw job envelope becomes
the payload of task NAME: the message id is the job id, the receive count its attempt.

Set AQW_SQS_ENDPOINT to an SQS-compatible endpoint, or leave it unset to use AWS.
"""

import asyncio
import json
import os
import uuid

import aioboto3
from pydantic import BaseModel

import aqw

ENDPOINT = os.environ.get("AQW_SQS_ENDPOINT")
REGION = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
NAME = f"docs-{uuid.uuid4().hex[:8]}"

url = f"sqs://{NAME}?region={REGION}&create=1&dlq={NAME}-dead&task=order_placed"
if ENDPOINT:
    url += f"&endpoint_url={ENDPOINT}"
app = aqw.App(url)
seen: list[int] = []


class OrderPlaced(BaseModel):
    order_id: int
    total: float


@app.task
async def order_placed(event: OrderPlaced, ctx: aqw.Context) -> None:
    seen.append(event.order_id)


async def main() -> None:
    session = aioboto3.Session()
    async with session.client("sqs", region_name=REGION, endpoint_url=ENDPOINT) as sqs:
        try:
            await app.broker.connect()  # creates the queues (create=1)
            queue_url = (await sqs.get_queue_url(QueueName=NAME))["QueueUrl"]
            # Another service's producer: a bare JSON body, no aqw envelope.
            for order_id in (101, 102):
                body = json.dumps({"order_id": order_id, "total": 42.5})
                await sqs.send_message(QueueUrl=queue_url, MessageBody=body)
            await sqs.send_message(QueueUrl=queue_url, MessageBody='{"order": "oops"}')

            worker = app.worker(burst=True)
            await worker.run()
            print("orders:", sorted(seen), "| dead-lettered:", worker.stats.dead)
            assert sorted(seen) == [101, 102] and worker.stats.dead == 1  # invalid payload
        finally:
            await app.close()
            for name in (NAME, f"{NAME}-dead"):
                qurl = (await sqs.get_queue_url(QueueName=name))["QueueUrl"]
                await sqs.delete_queue(QueueUrl=qurl)


if __name__ == "__main__":
    asyncio.run(main())
