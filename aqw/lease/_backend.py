"""Where leases live (``LeaseBackend``, re-exported by ``aqw.lease``; kept apart from
``_lease.py``, the context manager), and how a ``Lease``
tells a backend from a Redis client (``is_lease_backend``)."""

from __future__ import annotations

from typing import Protocol


class LeaseBackend(Protocol):
    """Where leases live. Each method is atomic on the server side."""

    async def acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        """Take ``key`` for ``token``; the fencing token on success, None when held."""

    async def renew(self, key: str, token: str, ttl_ms: int) -> bool:
        """Extend ``key`` to ``ttl_ms`` from now if ``token`` still holds it."""

    async def release(self, key: str, token: str) -> bool:
        """Delete ``key`` if ``token`` still holds it."""


_backend_classes: set[type] = set()  # defining every method: checked once (a Lease per job)


def is_lease_backend(obj: object) -> bool:
    """True for a ``LeaseBackend`` (anything else given to a Lease is taken for a Redis
    client, without importing redis here)."""
    names, kind = ("acquire", "renew", "release"), type(obj)
    if kind not in _backend_classes and all(callable(getattr(kind, n, None)) for n in names):
        _backend_classes.add(kind)
    return kind in _backend_classes or all(callable(getattr(obj, n, None)) for n in names)
