"""The marks contract (``aqw.testing.contract.MarksContract``) on every broker of aqw
(``conftest.py``)."""

import pytest

from aqw.testing.contract import MarksContract

pytestmark = pytest.mark.timeout(30)


class TestMarks(MarksContract):
    pass
