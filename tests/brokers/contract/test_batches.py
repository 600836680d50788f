"""The batch counts contract (``aqw.testing.contract.BatchesContract``) on every broker of aqw
(``conftest.py``; the brokers without batch counts are skipped, saying so)."""

import pytest

from aqw.testing.contract import BatchesContract

pytestmark = pytest.mark.timeout(30)


class TestBatches(BatchesContract):
    pass
