"""Leases: exclusive, expiring, fenced ownership of a key (``Lease``, over any
``LeaseBackend``), the one task that renews many of them (``LeaseKeeper``), and Redlock, a
backend over a majority of independent Redis servers (``aqw.lease.redlock``)."""

from ._keeper import LeaseKeeper
from ._lease import KeepAlive, Lease, LeaseBackend, is_lease_backend

__all__ = ["KeepAlive", "Lease", "LeaseBackend", "LeaseKeeper", "is_lease_backend"]
