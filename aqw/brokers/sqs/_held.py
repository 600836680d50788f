"""The messages this process received and has not settled (``HeldMessages``): each one's
latest receipt handle and visibility, and which message holds each job's lease key."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from ...lease import Lease
from ..base import Delivery


@dataclass(slots=True)
class Held:
    """A message this process received and has not settled."""

    receipt: str
    key: str | None  # the job's lease key, None when the body is not a job
    count: int  # ApproximateReceiveCount
    received: float  # time.monotonic() at receive
    visible_until: float  # monotonic time its visibility runs out
    token: str | None = None  # the lease token of the holder running it


class HeldMessages(Mapping[str, Held]):
    """Message id -> the message as last received, and job lease key -> the message id of the
    job's holder. A job's lease key is ``lease_prefix`` + its id (``Broker.job_lease_key``)."""

    def __init__(self, lease_prefix: str) -> None:
        self.lease_prefix = lease_prefix
        self._held: dict[str, Held] = {}
        self._keys: dict[str, str] = {}
        self._pruned = time.monotonic()  # when prune last looked

    def __getitem__(self, mid: str) -> Held:
        return self._held[mid]

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)

    def lease_key(self, job_id: str) -> str:
        return self.lease_prefix + job_id

    def is_job_key(self, key: str) -> bool:
        """True for a job lease key of this queue (not a resource lock)."""
        return key.startswith(self.lease_prefix)

    def add(self, mid: str, held: Held) -> None:
        """Track a message just received. Redelivered while we still run it: the holder keeps
        it (its token carries over), and a job's key stays with the message whose holder runs
        it."""
        before = self._held.get(mid)
        if before is not None:
            held.token = before.token
        self._held[mid] = held
        if held.key is not None:
            owner = self._held.get(self._keys.get(held.key, ""))
            if owner is None or owner is held or owner.token is None:
                self._keys[held.key] = mid

    def of_job(self, key: str) -> tuple[str, Held] | None:
        """The message id and message that hold the job lease ``key``, or None."""
        mid = self._keys.get(key)
        held = self._held.get(mid) if mid is not None else None
        return (mid, held) if mid is not None and held is not None else None

    def forget(self, mid: str) -> Held | None:
        held = self._held.pop(mid, None)
        if held is not None and held.key is not None and self._keys.get(held.key) == mid:
            del self._keys[held.key]
        return held

    def owns(self, delivery: Delivery, lease: Lease | None) -> bool:
        """False when another holder runs ``delivery``'s job (``take`` would refuse it)."""
        held = self._held.get(delivery.id)
        return held is None or lease is None or held.token in (None, lease.token)

    def take(self, delivery: Delivery, lease: Lease | None) -> Held | None:
        """Stop tracking ``delivery``; its receipt, or None when another holder runs its job."""
        if not self.owns(delivery, lease):
            return None
        held = self.forget(delivery.id)
        if held is None:
            now = time.monotonic()
            held = Held(str(delivery.receipt), None, delivery.delivery_count, now, now)
        return held

    def prune(self) -> None:
        """Forget received messages nobody ran (refused leases, buffers) once long invisible."""
        now = time.monotonic()
        if now - self._pruned < 30:
            return
        self._pruned = now
        for mid, held in list(self._held.items()):
            if held.token is None and held.visible_until < now - 60:
                self.forget(mid)
