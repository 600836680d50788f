"""The broker contract suite: the tests every broker passes, for a broker written outside
aqw as for aqw's own (``docs/brokers/writing-a-broker.md``).

Subclass the contracts of the parts your broker has, in a test module, and give them a
``subject`` fixture (here, or in a ``conftest.py``)::

    import pytest
    from aqw.testing.contract import RecordsContract, Subject, TransportContract

    @pytest.fixture
    async def subject():
        queue = fresh_queue_name()
        yield Subject(lambda **hints: MyBroker(queue), queue)
        delete_queue(queue)

    class TestMyTransport(TransportContract): ...
    class TestMyRecords(RecordsContract): ...

``Subject.traits`` says where the broker legitimately differs (``Traits``); every test
asserts the documented behaviour of either side. Needs pytest and pytest-asyncio
(``pip install 'aqw[testing]'``).

====================  ==========================================================
contract              what it covers
====================  ==========================================================
``TransportContract``  publish, fetch, settle, give back, schedule, DLQ, depth, keys,
                      leases and fencing, the start step, recovery, transient errors
``RecordsContract``   ``broker.records``: each step's record, cancel, waits, expiry,
                      the running jobs' states
``StatusContract``    ``broker.status``: heartbeats
``MarksContract``     ``broker.marks``: schedule marks
``HistoryContract``   ``broker.history``: depth samples, the delayed page
``DebounceContract``  ``broker.debounce``: debounced enqueue
``LimitsContract``    ``broker.flow_limits``: the start step under limits
``BatchesContract``   ``broker.batches``: each child counted once in its settle,
                      one callback job, sealing, nesting, a flow's gate
``ControlContract``   ``broker.control``: pause, the waiting list, delete, promote, find
``RatesContract``     ``broker.rates``: counts and durations by minute and hour
====================  ==========================================================
"""

from ._kit import Kit, Subject, Traits
from .batches import BatchesContract
from .control import ControlContract, RatesContract
from .parts import DebounceContract, HistoryContract, LimitsContract, MarksContract, StatusContract
from .records import RecordsContract
from .transport import TransportContract

__all__ = [
    "BatchesContract",
    "ControlContract",
    "DebounceContract",
    "HistoryContract",
    "Kit",
    "LimitsContract",
    "MarksContract",
    "RatesContract",
    "RecordsContract",
    "StatusContract",
    "Subject",
    "Traits",
    "TransportContract",
]
