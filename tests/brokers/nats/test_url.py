"""``nats://`` URLs: the family in ``aqw.brokers.FAMILIES``, its options, and the one-line
refusals (a bad option, partitions, a queue name that cannot name a stream, a priority)."""

from __future__ import annotations

import pytest

import aqw
from aqw.brokers import FAMILIES, from_url
from aqw.brokers.nats import NatsBroker
from aqw.job import Job

from .conftest import URL


def test_the_scheme_opens_a_nats_broker_with_its_options() -> None:
    assert "nats" in FAMILIES
    b = from_url("nats://u:secret@a:4222,b:4223/?queue=jobs&replicas=3&ack_wait=12", "x")
    assert isinstance(b, NatsBroker) and b.queue == "jobs"
    assert b.servers == ["nats://u:secret@a:4222", "nats://u:secret@b:4223"]
    assert (b.settings.replicas, b.settings.ack_wait) == (3, 12.0)
    assert "secret" not in b.describe() and b.describe() == "nats://a,b queue=jobs"
    assert from_url("nats://", "emails").servers == ["nats://127.0.0.1:4222"]
    assert aqw.App("nats://127.0.0.1:4222", queue="emails").broker.queue == "emails"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("nats://h/?replicas=0", "replicas='0': expected an integer >= 1"),
        ("nats://h/?ack_wait=soon", "ack_wait='soon': expected seconds > 0"),
        ("nats://h/?queue=a.b", "queue 'a.b': a nats:// queue name is letters"),
    ],
)
def test_bad_options_are_refused_in_one_line(url: str, why: str) -> None:
    with pytest.raises(aqw.ConfigError, match=why.replace("(", r"\(").replace(".", r"\.")):
        from_url(url)


def test_partitions_are_refused() -> None:
    with pytest.raises(aqw.ConfigError, match="partitions=2: only a Redis queue"):
        from_url("nats://h", partitions=2)


async def test_a_priority_is_taken_at_enqueue_and_read_at_its_level(nats_queue: str) -> None:
    b = from_url(f"{URL}?queue={nats_queue}")
    await b.publish([Job(task="t", priority=0), Job(task="t", priority=5)])
    assert (await b.depth()).waiting == 2
    got = await b.fetch(2, 0.5)
    assert [d.level for d in got] == [5, 0]
    await b.close()
