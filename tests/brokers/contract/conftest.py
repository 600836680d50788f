"""The ``subject`` of the broker contract suite (``aqw.testing.contract``): every broker of
aqw in turn, on a fresh queue: the in-process ``MemoryBroker``, ``RedisBroker`` on fakeredis
and on the real Redis, ``SQSBroker`` on moto (server mode, tests/brokers/conftest.py), and
``PartitionedBroker`` (a queue over 3 partitions) on fakeredis and on the real Redis. Each
test module runs one contract over the brokers that have its part (the others are skipped,
saying which part they lack).

Where a broker legitimately differs, its ``Traits`` say so and the test asserts the
documented behaviour: SQS (docs/brokers/sqs.md, the ``aqw.brokers.sqs`` package docstring)
has a visibility lease (reclaim recovers nothing, the body of a retry cannot change, every
receive counts as an attempt) and approximate counts, in whole seconds. SQS cases are kept
to a handful of messages each: moto is slow under a backlog (../shared/FIELD-NOTES.md)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.exceptions
from conftest import open_backend

from aqw.brokers.base import Broker
from aqw.testing.contract import Subject, Traits

KINDS = [
    "memory",
    "fakeredis",
    pytest.param("redis", marks=pytest.mark.redis),
    "sqs",
    "fakeredis-partitioned",
    pytest.param("redis-partitioned", marks=pytest.mark.redis),
]

REDIS = Traits(transient=(redis.exceptions.ConnectionError, redis.exceptions.TimeoutError))


@pytest.fixture(params=KINDS)
def contract_kind(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    """The broker kind, and for SQS the moto endpoint (moto starts only when SQS is tested)."""
    kind: str = request.param
    return kind, request.getfixturevalue("sqs_endpoint") if kind == "sqs" else None


@pytest.fixture
async def subject(
    contract_kind: tuple[str, str | None], queue_names: Callable[[], str]
) -> AsyncIterator[Subject]:
    """A broker kind on a fresh queue (its keys are deleted from the real Redis afterwards)."""
    kind, endpoint = contract_kind
    queue = queue_names()
    async with contextlib.AsyncExitStack() as stack:
        if kind == "sqs":
            assert endpoint is not None
            new_broker = await stack.enter_async_context(_sqs_queue(endpoint, queue))
            from aqw.brokers.sqs import SQSUnavailable

            traits = Traits(True, True, delay=1.0, block=1.0, transient=(SQSUnavailable,))
            yield Subject(new_broker, queue, traits)
            return
        backend = await stack.enter_async_context(open_backend(kind, queue))

        def new(**_: Any) -> Broker:
            return backend.broker()

        yield Subject(new, queue, Traits() if kind == "memory" else REDIS)


@contextlib.asynccontextmanager
async def _sqs_queue(endpoint: str, queue: str) -> AsyncIterator[Callable[..., Broker]]:
    """A freshly reset moto, queue ``queue`` and its dead-letter queue, and a factory of
    SQSBrokers on them. No ``wait=``: the ``block`` of each fetch sets the long poll."""
    import aioboto3

    from aqw.brokers.sqs import SQSBroker

    from ..conftest import SQSKit, _reset

    await asyncio.to_thread(_reset, endpoint)
    session = aioboto3.Session()
    async with session.client("sqs", region_name="us-east-1", endpoint_url=endpoint) as client:
        await SQSKit(endpoint, client).create(queue, dead=f"{queue}-dead")

        def new_broker(**options: Any) -> Broker:
            return SQSBroker(
                queue, region="us-east-1", endpoint_url=endpoint, dlq=f"{queue}-dead", **options
            )

        yield new_broker
