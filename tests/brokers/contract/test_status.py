"""The status contract (``aqw.testing.contract.StatusContract``) on every broker of aqw
(``conftest.py``)."""

import pytest

from aqw.testing.contract import StatusContract

pytestmark = pytest.mark.timeout(30)


class TestStatus(StatusContract):
    pass
