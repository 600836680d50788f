"""Leases in a JetStream key-value bucket: one key per held lease (a running job, a
resource lock, the scheduler's leader), its value ``<token> <expires_at>`` (seconds since the
epoch), written only with an expected revision: ``create`` when the key is absent or
deleted, ``update(last=revision)`` when it expired or is renewed, ``delete(last=revision)``
on release. The revision of the write that took the lease is the **fencing token**: the
bucket's sequence, which only grows, whichever key is written, so a new holder's token is
greater than every token handed out before for any key of the bucket.

What it does not do: a key's expiry is judged by the clocks of the processes that read it
(2.9 has no per-key TTL), so workers' clocks must agree to well under a lease's TTL (NTP).
The fence does not depend on the clocks: a paused ex-holder's settle is refused by the
revision whatever the clocks say.
"""

from __future__ import annotations

import re
import time

from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

#: The error codes of a write whose expected last revision was not the key's.
WRONG_LAST = (10071, 10164)

#: The characters a KV key may hold; any other is written as ``=XX`` (its byte in hex).
_UNSAFE = re.compile(rb"[^-_/.a-zA-Z0-9]")


def kv_key(key: str) -> str:
    """``key`` (e.g. ``aqw:{q}:lock:customer:7``) as a valid KV key, one to one."""
    return _UNSAFE.sub(lambda m: b"=%02X" % m.group()[0], key.encode()).decode()


def _value(token: str, ttl_ms: int) -> tuple[bytes, float]:
    """The stored value of a lease, and its expiry."""
    expires = time.time() + ttl_ms / 1000
    return f"{token} {expires!r}".encode(), expires


def _holder(value: bytes | None) -> tuple[str, float]:
    """(token, expires_at) of a stored lease; an unreadable value counts as expired."""
    token, _, expires = (value or b"").decode("utf-8", "replace").partition(" ")
    try:
        return token, float(expires)
    except ValueError:
        return token, 0.0


class KvLeaseBackend:
    """A ``LeaseBackend`` on a KV bucket (module docstring). It remembers the revision of
    each lease it wrote, so a renewal or a release is one compare-and-set."""

    __slots__ = ("_kv", "_revisions")

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv
        #: key -> (token, revision, expires_at) of the leases this backend wrote last.
        self._revisions: dict[str, tuple[str, int, float]] = {}

    async def _current(self, key: str) -> tuple[str, float, int] | None:
        """(token, expires_at, revision) of ``key``'s lease, None when it has none."""
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError:  # absent, or deleted (KeyDeletedError)
            return None
        if entry.revision is None:
            return None
        token, expires = _holder(entry.value)
        return token, expires, entry.revision

    async def acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        k = kv_key(key)
        value, expires_at = _value(token, ttl_ms)
        try:  # most keys are new (a job's first start): one round trip
            revision = await self._kv.create(k, value)
        except KeyWrongLastSequenceError:
            pass  # it exists: held, or expired
        else:
            self._revisions[k] = (token, revision, expires_at)
            return revision
        current = await self._current(k)
        try:
            if current is None:
                revision = await self._kv.create(k, value)
            else:
                held, expires, last = current
                if held != token and expires > time.time():
                    return None
                revision = await self._kv.update(k, value, last=last)
        except KeyWrongLastSequenceError:
            return None  # another holder wrote it between the read and the write
        self._revisions[k] = (token, revision, expires_at)
        return revision

    async def _mine(self, k: str, token: str) -> int | None:
        """The revision of ``k`` while this token holds it unexpired, else None."""
        current = await self._current(k)
        if current is None:
            return None
        held, expires, revision = current
        return revision if held == token and expires > time.time() else None

    async def renew(self, key: str, token: str, ttl_ms: int) -> bool:
        k = kv_key(key)
        known = self._revisions.get(k)
        if known is not None and known[0] == token:
            last = known[1] if known[2] > time.time() else None
        else:
            last = await self._mine(k, token)
        if last is None:
            return False
        value, expires_at = _value(token, ttl_ms)
        try:
            revision = await self._kv.update(k, value, last=last)
        except KeyWrongLastSequenceError:
            self._revisions.pop(k, None)
            return False
        self._revisions[k] = (token, revision, expires_at)
        return True

    async def release(self, key: str, token: str) -> bool:
        """Delete the lease when this token holds it (expired or not: nobody else took it
        since); False, touching nothing, when another token wrote it."""
        k = kv_key(key)
        known = self._revisions.pop(k, None)
        if known is not None and known[0] == token:
            last: int | None = known[1]
        else:
            current = await self._current(k)
            last = current[2] if current is not None and current[0] == token else None
        if last is None:
            return False
        try:
            await self._kv.delete(k, last=last)
        except APIError as exc:
            if exc.err_code in WRONG_LAST:
                return False  # another holder wrote it since
            raise
        return True

    async def owner(self, key: str) -> str | None:
        """The token holding ``key`` unexpired, if any."""
        current = await self._current(kv_key(key))
        if current is None or current[1] <= time.time():
            return None
        return current[0]
