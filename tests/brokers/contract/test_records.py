"""The records contract (``aqw.testing.contract.RecordsContract``) on every broker of aqw
(``conftest.py``)."""

import pytest

from aqw.testing.contract import RecordsContract

pytestmark = pytest.mark.timeout(30)


class TestRecords(RecordsContract):
    pass
