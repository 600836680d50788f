"""``clock_for(backend)``: a ``MockClock`` on the memory backend, nothing elsewhere. A test
on every backend waits for a TTL in real time on Redis (the server keeps its own time) and
not at all on ``memory://``."""

from __future__ import annotations

import contextlib
from typing import Any

from aqw.testing import MockClock


def clock_for(backend: Any) -> contextlib.AbstractAsyncContextManager[Any]:
    """A ``MockClock`` when ``backend`` (``tests.conftest.Backend``) is the memory broker."""
    return MockClock() if backend.kind == "memory" else contextlib.nullcontext()
