"""Redis-py's errors told apart without loading redis-py: an error of the client exists only
once the Redis plumbing that raises it has been loaded, so the command line, which handles
errors of every broker, asks here and loads nothing for an app on another broker."""

from __future__ import annotations

import sys
from typing import cast

#: The modules of the plumbing that hold the answers (``client.CLIENT_ERRORS``,
#: ``cluster.cluster_redirect``).
_CLIENT = "aqw._redis.client"
_CLUSTER = "aqw._redis.cluster"


def client_errors() -> tuple[type[Exception], ...]:
    """The Redis client's errors once its module is loaded; none before (none can exist)."""
    loaded = sys.modules.get(_CLIENT)
    return cast(tuple[type[Exception], ...], loaded.CLIENT_ERRORS) if loaded else ()


def cluster_redirect(exc: BaseException) -> str | None:
    """``cluster.cluster_redirect(exc)`` once that module is loaded; None before."""
    loaded = sys.modules.get(_CLUSTER)
    return cast(str | None, loaded.cluster_redirect(exc)) if loaded else None
