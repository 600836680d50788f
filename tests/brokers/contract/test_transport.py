"""The transport contract (``aqw.testing.contract.TransportContract``) on every broker of aqw
(``conftest.py``)."""

import pytest

from aqw.testing.contract import TransportContract

pytestmark = pytest.mark.timeout(30)


class TestTransport(TransportContract):
    pass
