"""The control and rates contracts (``aqw.testing.contract.ControlContract``,
``RatesContract``) on every broker of aqw (``conftest.py``)."""

import pytest

from aqw.testing.contract import ControlContract, RatesContract

pytestmark = pytest.mark.timeout(30)


class TestControl(ControlContract):
    pass


class TestRates(RatesContract):
    pass
