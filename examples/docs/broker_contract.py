"""The broker contract suite on a broker written outside aqw: the example broker of aqw's
own tests (``tests/plugin_broker``, an in-process queue on the public contract).

Needs pytest and pytest-asyncio (``pip install 'aqw[testing]'``). Run it with
``python -m pytest examples/docs/broker_contract.py`` (running this file as a script does
the same).
"""

import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from aqw.testing.contract import (
    MarksContract,
    RecordsContract,
    StatusContract,
    Subject,
    TransportContract,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # your package instead
import plugin_broker


@pytest_asyncio.fixture
async def subject() -> AsyncIterator[Subject]:
    """The broker under test, on a fresh queue; ``new_broker`` makes another broker of it."""
    queue = f"contract-{uuid.uuid4().hex[:8]}"
    yield Subject(lambda **hints: plugin_broker.PlugBroker(queue), queue)
    plugin_broker.QUEUES.pop(queue, None)  # the queue deleted


class TestTransport(TransportContract):
    pass


class TestRecords(RecordsContract):
    pass


class TestStatus(StatusContract):
    pass


class TestMarks(MarksContract):
    pass


if __name__ == "__main__":  # pytest in a process of its own, as on the command line
    command = [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider"]
    sys.exit(subprocess.run(command).returncode)
