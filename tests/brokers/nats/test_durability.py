"""Durability said out loud: one warning at connect when the queue's stream (as the server
has it) is R1, naming the server's version and what its sync does not cover; none for R3."""

from __future__ import annotations

import logging

import pytest

from aqw.brokers.nats import _broker
from aqw.brokers.nats._layout import durability_note

from .conftest import broker

pytestmark = pytest.mark.timeout(30)


def test_the_note_for_each_server_and_replica_count() -> None:
    old = durability_note("2.9.10", 1)
    assert old is not None and "2.9.10 has no setting to sync on every write" in old
    assert "replicas=3" in old and "docs/brokers/nats.md" in old
    new = durability_note("2.10.4", 1)
    assert new is not None and "sync_interval" in new
    assert durability_note("2.9.10", 3) is None


async def test_connect_logs_it_once_from_the_streams_replicas(
    nats_queue: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_broker, "_warned", set())
    caplog.set_level(logging.WARNING, "aqw.brokers.nats")
    first, second = broker(nats_queue), broker(nats_queue)
    await first.connect()
    await second.connect()
    notes = [r.message for r in caplog.records if "synced to disk" in r.message]
    assert len(notes) == 1 and "R1" in notes[0]
    await first.close()
    await second.close()
