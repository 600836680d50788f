"""SQS fixtures: one moto server (server mode, loopback, a free port) for the whole session,
reset before each test that uses it, and a small kit to create queues and look inside them
with the real aioboto3 client over HTTP."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

import aqw
from aqw.brokers.sqs import SQSBroker
from tests._helpers import moto_server

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def sqs_endpoint() -> Iterator[str]:
    """A moto server on 127.0.0.1 for the session; AWS_* variables point at fake credentials."""
    saved = {k: os.environ.get(k) for k in AWS_ENV}
    os.environ.update(AWS_ENV)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    try:
        with moto_server() as endpoint:
            yield endpoint
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class SQSKit:
    """Queues on the moto server, and raw access to them for assertions."""

    def __init__(self, endpoint: str, client: Any) -> None:
        self.endpoint = endpoint
        self.client = client

    def url(self, queue: str, **options: Any) -> str:
        """An ``sqs://`` broker URL for ``queue`` on this server."""
        query = {"region": "us-east-1", "endpoint_url": self.endpoint, "wait": 1, **options}
        return f"sqs://{queue}?" + "&".join(f"{k}={v}" for k, v in query.items())

    async def create(
        self,
        name: str,
        *,
        visibility: int = 30,
        dead: str | None = None,
        max_receives: int | None = None,
    ) -> str:
        """Create ``name`` (FIFO when it ends in .fifo); with ``max_receives``, a RedrivePolicy
        to ``dead`` (created too)."""
        attrs = {"VisibilityTimeout": str(visibility)}
        if name.endswith(".fifo"):
            attrs["FifoQueue"] = "true"
        if dead is not None:
            dead_url = await self.create(dead)
            if max_receives is not None:
                arn = await self.attribute(dead_url, "QueueArn")
                attrs["RedrivePolicy"] = json.dumps(
                    {"deadLetterTargetArn": arn, "maxReceiveCount": max_receives}
                )
        reply = await self.client.create_queue(QueueName=name, Attributes=attrs)
        return str(reply["QueueUrl"])

    async def queue_url(self, name: str) -> str:
        return str((await self.client.get_queue_url(QueueName=name))["QueueUrl"])

    async def attribute(self, url: str, name: str) -> str:
        reply = await self.client.get_queue_attributes(QueueUrl=url, AttributeNames=[name])
        return str(reply["Attributes"].get(name, ""))

    async def count(self, url: str) -> int:
        """Messages visible, in flight and delayed."""
        names = [
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ]
        reply = await self.client.get_queue_attributes(QueueUrl=url, AttributeNames=names)
        return sum(int(reply["Attributes"].get(n, 0)) for n in names)


def _reset(endpoint: str) -> None:
    request = urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 200


@pytest.fixture
async def sqs(sqs_endpoint: str) -> AsyncIterator[SQSKit]:
    """A freshly reset moto server and an aioboto3 client for it."""
    import aioboto3

    await asyncio.to_thread(_reset, sqs_endpoint)
    session = aioboto3.Session()
    async with session.client("sqs", region_name="us-east-1", endpoint_url=sqs_endpoint) as client:
        yield SQSKit(sqs_endpoint, client)


#: ``new_app(...)``: an App whose broker is closed after the test.
AppFactory = Callable[..., aqw.App]


@pytest.fixture
async def new_app() -> AsyncIterator[AppFactory]:
    """``new_app(...)`` whose broker is closed after the test, pass or fail."""
    apps: list[aqw.App] = []

    def make(*args: Any, **kwargs: Any) -> aqw.App:
        apps.append(aqw.App(*args, **kwargs))
        return apps[-1]

    yield make
    for app in apps:
        await app.close()


def broker_of(app: aqw.App) -> SQSBroker:
    assert isinstance(app.broker, SQSBroker)
    return app.broker
