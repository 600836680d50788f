"""The history contract (``aqw.testing.contract.HistoryContract``) on every broker of aqw
(``conftest.py``)."""

import pytest

from aqw.testing.contract import HistoryContract

pytestmark = pytest.mark.timeout(30)


class TestHistory(HistoryContract):
    pass
