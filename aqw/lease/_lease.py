"""Leases: exclusive, expiring, fenced ownership of a key, as an async context manager.

``async with Lease(redis, "customer:7", ttl=10) as lease:`` acquires the key with
``SET key token NX PX ttl`` and a fencing token from ``INCR``, renews it in the background
every ``ttl/3`` (sooner when the renewals' round trips need it: ``RenewalTimes``) with an
atomic compare-token-then-``PEXPIRE``, and releases it on exit with an atomic
compare-token-then-``DEL``.

The block's deadline is the lease's *confirmed expiry*: the moment the last successful renewal
(or the acquire) was sent, plus ``ttl``. When a renewal is refused, or the process was paused or
blocked past that expiry, the block is cancelled, and cancelled again until it has exited (one
cancellation can be swallowed), and ``aqw.LeaseLost`` is raised out of the ``async with``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, cast

from .._cancel import Canceller
from .._ids import new_token, now
from ..errors import ConfigError, LeaseLost, LeaseUnavailable
from ._backend import LeaseBackend, is_lease_backend
from ._keeper import LeaseKeeper, RenewalTimes

__all__ = ["KeepAlive", "Lease", "LeaseBackend", "is_lease_backend"]

log = logging.getLogger("aqw.lease")

KeepAlive = Callable[[], Awaitable[bool]]

#: Fire-and-forget cleanup tasks (releases after a cancelled acquire), referenced until done.
_background: set[asyncio.Task[None]] = set()


class Lease:
    """An exclusive, renewed, fenced lease on ``key``.

    Args:
        backend: a ``redis.asyncio`` client (``Redis`` or ``RedisCluster``), or any
            ``LeaseBackend``.
        key: the key to own. Its fencing counter is ``<key>:fence``; on a cluster it must
            be in the key's slot, so an untagged key's counter is ``{<key>}:fence``, and an
            untagged key holding a ``}`` is refused with ``aqw.ConfigError``.
        ttl: seconds the lease lives without renewal.
        wait: seconds to wait for a held key before raising ``aqw.LeaseUnavailable``;
            ``None`` or ``0`` fails fast.
        renew_every: seconds between renewals (default ``ttl / 3``); sooner while two
            renewal timeouts of the measured round trips would not fit in what is left.
        keep_alive: an extra check sent with every renewal (beside it: one round trip where
            the backend batches); returning False loses the lease (the runtime uses it to
            keep a broker delivery from being reclaimed).
        keeper: a shared ``LeaseKeeper`` to renew many leases from one task instead of a
            task per lease.

    Attributes after entering: ``token`` (secret to this holder), ``fencing_token`` (a strictly
    increasing integer to hand to a datastore), ``expires_at`` (wall-clock seconds).
    """

    def __init__(
        self,
        backend: LeaseBackend | Any,
        key: str,
        *,
        ttl: float = 30.0,
        wait: float | None = None,
        renew_every: float | None = None,
        keep_alive: KeepAlive | None = None,
        keeper: LeaseKeeper | None = None,
    ) -> None:
        if ttl <= 0:
            raise ConfigError(f"Lease ttl must be > 0 seconds, got {ttl!r}")
        if wait is not None and wait < 0:
            raise ConfigError(f"Lease wait must be >= 0 seconds, got {wait!r}")
        if renew_every is not None and not 0 < renew_every < ttl:
            raise ConfigError(f"Lease renew_every must be in (0, ttl), got {renew_every!r}")
        if not key:
            raise ConfigError("Lease key must be a non-empty string")
        if is_lease_backend(backend):
            self.backend: LeaseBackend = backend
        else:
            from .._redis.lease import RedisLeaseBackend  # redis-py, loaded when used

            redis_backend = RedisLeaseBackend(cast(Any, backend))
            redis_backend.fence_key(key)  # on a cluster: a key it cannot fence fails here
            self.backend = redis_backend
        self.key = key
        self.ttl = ttl
        self.wait = wait or 0.0
        self.renew_every = renew_every if renew_every is not None else ttl / 3
        self.token = new_token()
        self.fencing_token = 0
        self.waited = 0.0
        self.renewals = 0
        self.lost_reason: str | None = None
        self._keep_alive = keep_alive
        self._keeper = keeper
        self._times = keeper.times if keeper is not None else RenewalTimes()
        self._ttl_ms = max(1, int(ttl * 1000))
        self._state = "new"  # new -> held -> (handed_over | released)
        self._expires_mono = 0.0
        self.next_renewal = 0.0
        #: Seconds before ``next_renewal`` that a keeper renews it with others due then.
        self.renew_early = 0.0
        self.renewing = False
        self._renewer: asyncio.Task[None] | None = None
        self._guard: Canceller | None = None
        self._block: asyncio.Task[Any] | None = None  # the block's task, while inside it
        self._baseline = 0  # the block's task's cancellation requests when it entered
        self._on_lost: tuple[Callable[[Lease], None], ...] = ()
        self._on_renewed: tuple[Callable[[Lease], None], ...] = ()

    # -- public surface ------------------------------------------------------------------

    @property
    def held(self) -> bool:
        """True while this holder owns the key: acquired, not lost, and its confirmed expiry
        not yet passed."""
        return self.lapsed() is None

    def lapsed(self) -> str | None:
        """Why this holder may no longer act under the lease (lost, or past its confirmed
        expiry), or None while it is held."""
        if self._state not in ("held", "handed_over"):
            return "the lease is not held"
        if self.lost_reason is not None:
            return self.lost_reason
        if asyncio.get_running_loop().time() >= self._expires_mono:
            return "the lease expired before a renewal was confirmed"
        return None

    @property
    def expires_in(self) -> float:
        """Seconds until the confirmed expiry (negative once it has passed)."""
        return self._expires_mono - asyncio.get_running_loop().time()

    @property
    def expires_at(self) -> float:
        """Wall-clock time (seconds since the epoch) until which the lease is confirmed."""
        loop = asyncio.get_running_loop()
        return now() + max(0.0, self._expires_mono - loop.time())

    @property
    def deadline(self) -> float:
        """When its keeper stops the block (``LeaseKeeper.watch``; loop time, inf: never)."""
        unguarded = self._block is None or self._guard is not None or self.lost_reason is not None
        return float("inf") if unguarded else self._expires_mono

    def expire(self) -> None:
        """The confirmed expiry passed with no renewal confirmed: stop the block (called by
        its keeper's timer, or by its own guard when it has no keeper)."""
        self._lose("the lease expired before a renewal was confirmed")

    def on_lost(self, callback: Callable[[Lease], None]) -> None:
        """Call ``callback(lease)`` when the lease is lost (for metrics and logs)."""
        self._on_lost = (*self._on_lost, callback)

    def on_renewed(self, callback: Callable[[Lease], None]) -> None:
        """Call ``callback(lease)`` after each successful renewal (for metrics and traces)."""
        self._on_renewed = (*self._on_renewed, callback)

    async def acquire(self) -> None:
        """Take the lease, waiting up to ``wait`` seconds; raise LeaseUnavailable if held."""
        if self._state != "new":
            raise RuntimeError("a Lease can be acquired once; create a new one")
        loop = asyncio.get_running_loop()
        current = asyncio.current_task()
        cancels = current.cancelling() if current is not None else 0
        started: float | None = None
        delay = 0.005
        while True:
            sent = loop.time()
            if started is None:
                started = sent  # a first-try acquisition has waited exactly 0
            try:
                fence = await self.backend.acquire(self.key, self.token, self._ttl_ms)
            except asyncio.CancelledError:
                # The command may have reached the server: never leave a key we might hold.
                self._release_in_background()
                raise
            if current is not None and current.cancelling() > cancels:
                # A cancellation arrived during the call but a lower layer swallowed it
                # (on Python 3.11, ``asyncio.wait_for`` inside redis-py returns a result that
                # races a cancel instead of raising). Honour it, and keep no key we took.
                if fence is not None:
                    self._release_in_background()
                raise asyncio.CancelledError
            if fence is not None:
                self.fencing_token = fence
                self._times.took(loop.time() - sent)
                self._confirmed(sent)
                self._state = "held"
                self.waited = sent - started
                return
            waited = loop.time() - started
            if waited >= self.wait:
                raise LeaseUnavailable(self.key, waited)
            await asyncio.sleep(min(self.wait - waited, delay * random.uniform(0.5, 1.0)))
            delay = min(delay * 2, 0.25)

    async def __aenter__(self) -> Lease:
        if self._state == "new":  # the worker acquires first, to tell its errors apart
            await self.acquire()
        elif self._state != "held" or self._guard is not None or self._block is not None:
            raise RuntimeError("a Lease can be entered once")
        task = asyncio.current_task()
        if task is not None:  # stopped at the expiry by its keeper's timer, or its own guard
            self._baseline, self._block = task.cancelling(), task
            if self._keeper is None:
                self._guard = Canceller(task, self._expires_mono, on_fire=self.expire)
        if self._keeper is not None:
            self._keeper.add(self)
            self._keeper.watch(self)
        else:
            self._renewer = asyncio.create_task(self._renew_loop(), name=f"lease-renew:{self.key}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._state == "handed_over" and self._guard is None and self._block is None:
            return  # hand_over stopped the renewals and the guard; the settle releases it
        self._stop_renewing()
        others = self._close_guard()
        try:
            if self._state == "held" and self.lost_reason is None and self.expires_in <= 0:
                self._mark_lost("the lease expired before the block finished")
            if self.lost_reason is not None and self._state == "held":
                if exc_type is asyncio.CancelledError and others > self._baseline:
                    return  # the block was also cancelled from outside: that stop wins
                raise LeaseLost(self.key, self.lost_reason) from exc
        finally:
            if self._state == "held":
                await self._release_shielded()

    async def release(self) -> bool:
        """Release now (compare-token-then-DEL). True when the key was still ours."""
        self._stop_renewing()
        if self._state != "held":
            return False
        self._state = "released"
        try:
            async with asyncio.timeout(self._release_budget()):
                return await self.backend.release(self.key, self.token)
        except Exception:
            log.warning("could not release lease %r; it expires in %.1fs", self.key, self.ttl)
            return False

    # -- runtime hooks --------------------------------------------------------------------

    def hand_over(self) -> None:
        """Stop renewing and stop guarding the block: the caller settles and releases the
        lease in one atomic step of its own (ack, retry or dead-letter), a step that itself
        checks the lease is still this holder's. Called by the worker, inside the block."""
        self._stop_renewing()
        self._close_guard()
        if self._state == "held":
            self._state = "handed_over"

    def _lose(self, reason: str) -> None:
        """The lease is gone: record why and stop the block, however long that takes."""
        if not self._mark_lost(reason):
            return
        if self._guard is None and self._block is not None:
            self._guard = Canceller(self._block, None)
        if self._guard is not None:
            self._guard.fire(reason)

    def _mark_lost(self, reason: str) -> bool:
        if self.lost_reason is not None or self._state != "held":
            return False
        self.lost_reason = reason
        log.warning("lease %r lost: %s", self.key, reason)
        for callback in self._on_lost:
            try:
                callback(self)
            except Exception:
                log.exception("lease-lost callback failed")
        return True

    def _close_guard(self) -> int:
        """Disarm the block's guard; the block's task's cancellation requests that remain."""
        guard, self._guard, self._block = self._guard, None, None
        if guard is None:
            task = asyncio.current_task()
            return task.cancelling() if task is not None else 0
        return guard.close()

    # -- internals ------------------------------------------------------------------------

    def _release_in_background(self) -> None:
        task = asyncio.get_running_loop().create_task(self._release_quietly())
        _background.add(task)  # the loop holds tasks weakly: keep it until it is done
        task.add_done_callback(_background.discard)

    async def _release_quietly(self) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.ttl):  # past that the key has expired anyway
                await self.backend.release(self.key, self.token)

    def _release_budget(self) -> float:
        """How long a release may take. A release that cannot reach the server must not hold
        the caller (the job slot, a shutdown) hostage to the client's socket timeouts and
        retries: past the lease's confirmed expiry the key is gone by itself, and a lost
        lease (usually lost because the server is unreachable) gets one short try."""
        floor = min(self.ttl, 0.25)
        if self.lost_reason is not None:
            return floor
        remaining = self._expires_mono - asyncio.get_running_loop().time()
        return max(floor, min(remaining, self.renew_every))

    async def _release_shielded(self) -> None:
        # The release goes on if the caller is cancelled; the cancellation still propagates.
        await asyncio.shield(asyncio.ensure_future(self.release()))

    def _stop_renewing(self) -> None:
        if self._keeper is not None:
            self._keeper.discard(self)
        if self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None

    async def _renew_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while self._state == "held" and self.lost_reason is None:
            await asyncio.sleep(max(0.0, self.next_renewal - loop.time()))
            await self.renew_once()

    def _confirmed(self, sent: float) -> None:
        """The acquire or a renewal sent at ``sent`` is confirmed: the expiry is ``sent`` plus
        the TTL (its send decides, not its reply), and the next renewal is planned."""
        after = self._times.renew_after(self.ttl, self.renew_every)
        self._expires_mono = sent + self.ttl
        self.next_renewal, self.renew_early = sent + after, after / 2

    async def _renew_and_check(self) -> tuple[bool, bool]:
        """The renewal and the ``keep_alive`` check, sent together: one round trip where the
        backend batches (the check's answer counts only when the renewal succeeded)."""
        renewal = self.backend.renew(self.key, self.token, self._ttl_ms)
        if self._keep_alive is None:
            return await renewal, True
        ok, alive = await asyncio.gather(renewal, self._keep_alive())
        return ok, ok and alive

    async def renew_once(self) -> None:
        """Renew once, retrying transient errors until the lease's own deadline (what the
        renewal task, or a ``LeaseKeeper``, runs at ``next_renewal``)."""
        loop = asyncio.get_running_loop()
        self.renewing = True
        last_error: BaseException | None = None
        delay = 0.05
        try:
            while self._state == "held" and self.lost_reason is None:
                remaining = self._expires_mono - loop.time()
                if remaining <= 0:
                    detail = f": {last_error!r}" if last_error else ""
                    self._lose(f"could not renew before the lease expired{detail}")
                    return
                sent = loop.time()  # its send decides the confirmed expiry, not its reply
                try:
                    async with asyncio.timeout(remaining):
                        ok, alive = await self._renew_and_check()
                except TimeoutError:
                    self._lose("renewal did not complete before the lease expired")
                    return
                except Exception as exc:
                    last_error = exc
                    await asyncio.sleep(min(delay, max(0.0, self._expires_mono - loop.time())))
                    delay = min(delay * 2, 1.0)
                    continue
                if not ok:
                    self._lose("renewal refused: the key was deleted or taken by another holder")
                elif not alive:
                    self._lose("the delivery is no longer ours (reclaimed or acknowledged)")
                elif self.lost_reason is None:
                    self._times.took(loop.time() - sent, remaining, self.key, self.ttl)
                    self.renewals += 1
                    self._confirmed(sent)
                    if self._guard is not None:
                        self._guard.move(self._expires_mono)
                    for callback in self._on_renewed:
                        try:
                            callback(self)
                        except Exception:
                            log.exception("lease-renewed callback failed")
                return
        finally:
            self.renewing = False
            if self._keeper is not None and self._state == "held":
                self._keeper.reschedule(self)
