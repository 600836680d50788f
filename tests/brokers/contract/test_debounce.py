"""The debounce contract (``aqw.testing.contract.DebounceContract``) on every broker of aqw
(``conftest.py``)."""

import pytest

from aqw.testing.contract import DebounceContract

pytestmark = pytest.mark.timeout(30)


class TestDebounce(DebounceContract):
    pass
