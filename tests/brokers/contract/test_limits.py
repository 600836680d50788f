"""The limits contract (``aqw.testing.contract.LimitsContract``) on every broker of aqw
(``conftest.py``)."""

import pytest

from aqw.testing.contract import LimitsContract

pytestmark = pytest.mark.timeout(30)


class TestLimits(LimitsContract):
    pass
