"""The broker contract (``aqw.testing.contract``) on the NATS JetStream broker against the
real server: the transport with its window lease (AckWait, ``Traits.window_lease``), and the
parts it has (records, status, marks, the depth history, debounce and the flow limits,
kept in NATS)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import nats.errors
import pytest

from aqw.brokers.base import Broker
from aqw.testing.contract import (
    DebounceContract,
    HistoryContract,
    LimitsContract,
    MarksContract,
    RecordsContract,
    StatusContract,
    Subject,
    Traits,
    TransportContract,
)

from .conftest import broker

pytestmark = pytest.mark.timeout(60)

#: A 2 s ack window for every broker of a test's queue (the ``visibility`` hint of the
#: recovery tests is that window: one consumer's AckWait is the queue's).
TRAITS = Traits(window_lease=True, transient=(nats.errors.ConnectionClosedError,))


@pytest.fixture
async def subject(nats_queue: str) -> AsyncIterator[Subject]:
    def new_broker(**_: Any) -> Broker:
        return broker(nats_queue, ack_wait=2.0)

    yield Subject(new_broker, nats_queue, TRAITS)


class TestNatsTransport(TransportContract):
    pass


class TestNatsRecords(RecordsContract):
    pass


class TestNatsStatus(StatusContract):
    pass


class TestNatsMarks(MarksContract):
    pass


class TestNatsHistory(HistoryContract):
    pass


class TestNatsLimits(LimitsContract):
    pass


class TestNatsDebounce(DebounceContract):
    pass
