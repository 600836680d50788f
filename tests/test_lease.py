"""Leases on fakeredis and on the real Redis: exclusion, renewal, loss, fencing, cancellation.

Each test owns the keys ``aqw:{<queue>}:lock:*`` of its own queue; the conftest deletes them.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Awaitable, Callable

import pytest
from _proxy import TcpProxy
from conftest import PrivateRedis
from redis.asyncio import Redis

import aqw
from tests._helpers import eventually, ttl_agrees

pytestmark = pytest.mark.timeout(60)

TTL = 0.4  # seconds; renewals every ~0.133 s


@pytest.fixture
def key(queue_name: str) -> str:
    return f"aqw:{{{queue_name}}}:lock:res"


async def wait_until(pred: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not await pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.01)


# -- mutual exclusion ----------------------------------------------------------------------------


async def test_hundred_waiting_acquirers_hold_one_at_a_time(lease_redis: Redis, key: str) -> None:
    inside = 0
    most_inside = 0
    order: list[int] = []

    async def contender() -> None:
        nonlocal inside, most_inside
        async with aqw.Lease(lease_redis, key, ttl=5.0, wait=60.0) as lease:
            inside += 1
            most_inside = max(most_inside, inside)
            order.append(lease.fencing_token)
            await asyncio.sleep(0.002)
            assert inside == 1
            inside -= 1

    await asyncio.gather(*(contender() for _ in range(100)))
    assert most_inside == 1
    assert len(order) == 100
    # every holder got a fresh fencing token, in the order they entered
    assert order == sorted(order) and len(set(order)) == 100
    assert await lease_redis.exists(key) == 0


async def test_hundred_fail_fast_acquirers_exactly_one_wins(lease_redis: Redis, key: str) -> None:
    won = 0
    refused = 0
    inside = 0

    async def contender() -> None:
        nonlocal won, refused, inside
        try:
            async with aqw.Lease(lease_redis, key, ttl=5.0):
                won += 1
                inside += 1
                assert inside == 1
                await asyncio.sleep(0.3)  # far longer than every other attempt takes
                inside -= 1
        except aqw.LeaseUnavailable as exc:
            assert exc.key == key
            refused += 1

    await asyncio.gather(*(contender() for _ in range(100)))
    assert (won, refused) == (1, 99)
    assert await lease_redis.exists(key) == 0


async def test_lease_unavailable_fails_fast_when_held(lease_redis: Redis, key: str) -> None:
    async with aqw.Lease(lease_redis, key, ttl=5.0):
        # Without a wait, one attempt and no sleep: fast by construction, not by a stopwatch.
        attempts: list[str] = []
        for lease in (aqw.Lease(lease_redis, key, ttl=5.0), aqw.Lease(lease_redis, key, wait=0)):
            _count_attempts(lease, attempts)
            with pytest.raises(aqw.LeaseUnavailable):
                async with lease:
                    pytest.fail("entered a held lease")
        assert attempts == ["acquire", "acquire"]
        # a bounded wait tries again until `wait` seconds have passed, then gives up
        waiting = aqw.Lease(lease_redis, key, ttl=5.0, wait=0.3)
        _count_attempts(waiting, attempts)
        started = time.monotonic()
        with pytest.raises(aqw.LeaseUnavailable) as info:
            await waiting.acquire()
        waited = time.monotonic() - started
        assert len(attempts) > 3  # it tried again (backoff from 5 ms, capped at 0.25 s)
        assert waited >= info.value.waited >= waiting.wait  # and waited at least the wait


def _count_attempts(lease: aqw.Lease, attempts: list[str]) -> None:
    """Note each acquisition attempt ``lease`` sends to its backend in ``attempts``."""
    send = lease.backend.acquire

    async def acquire(key: str, token: str, ttl_ms: int) -> int | None:
        attempts.append("acquire")
        return await send(key, token, ttl_ms)

    lease.backend.acquire = acquire  # type: ignore[method-assign]


async def test_wait_acquires_after_the_holder_releases(lease_redis: Redis, key: str) -> None:
    released_at = 0.0
    hold = 0.3
    attempts: list[str] = []
    waiter = aqw.Lease(lease_redis, key, ttl=5.0, wait=5.0)
    _count_attempts(waiter, attempts)

    async def holder(ready: asyncio.Event) -> None:
        nonlocal released_at
        async with aqw.Lease(lease_redis, key, ttl=5.0):
            ready.set()
            await eventually(lambda: attempts, 10, "the waiter's first (refused) try")
            await asyncio.sleep(hold)
            released_at = time.monotonic()  # the key goes right after this

    ready = asyncio.Event()
    task = asyncio.create_task(holder(ready))
    await ready.wait()
    async with waiter:
        got_at = time.monotonic()
        assert released_at > 0, "acquired before the holder released"
        assert await lease_redis.get(key) == waiter.token.encode()
    await task
    assert got_at >= released_at  # it waited for the release, however long that took
    assert len(attempts) > 1  # refused, then tried again
    assert waiter.waited >= hold  # the holder kept it that long after the waiter's first try


# -- renewal and loss ----------------------------------------------------------------------------


async def test_renewal_keeps_the_lease_for_five_ttls(lease_redis: Redis, key: str) -> None:
    lease = aqw.Lease(lease_redis, key, ttl=TTL)
    async with lease:
        token = lease.token
        fence = lease.fencing_token
        await asyncio.sleep(5 * TTL)
        assert await lease_redis.get(key) == token.encode()
        assert 0 < await lease_redis.pttl(key) <= TTL * 1000
        assert lease.held and lease.lost_reason is None
    assert lease.token == token and lease.fencing_token == fence
    # Renewed every ttl/3 (~15 times in 5 ttls); the key outliving 5 ttls needs at least 4.
    assert lease.renewals >= 4
    assert await lease_redis.exists(key) == 0


@pytest.mark.parametrize("how", ["deleted", "overwritten"])
async def test_losing_the_key_cancels_the_body_within_one_ttl(
    lease_redis: Redis, key: str, how: str
) -> None:
    lease = aqw.Lease(lease_redis, key, ttl=TTL)
    finished = False
    overwritten_at = 0.0
    with pytest.raises(aqw.LeaseLost) as info:
        async with lease:
            await asyncio.sleep(0.2)
            if how == "deleted":
                await lease_redis.delete(key)
            else:
                overwritten_at = time.monotonic()
                await lease_redis.set(key, "someone-else", px=10_000)
            renewed_before = lease.renewals
            await asyncio.sleep(10 * TTL)
            finished = True
    assert not finished
    # Stopped by the first renewal after the loss: none succeeded once the key was gone (but
    # the one that was on its way as it went).
    assert lease.renewals <= renewed_before + 1
    assert info.value.key == key
    assert "renewal refused" in str(info.value)
    assert not lease.held
    if how == "overwritten":
        # never release a lease we no longer hold: the other holder's key survives
        assert await lease_redis.get(key) == b"someone-else"
        assert ttl_agrees(await lease_redis.pttl(key), 10_000, since=overwritten_at)
    else:
        assert await lease_redis.exists(key) == 0


async def test_holder_never_deletes_a_lease_it_no_longer_owns(lease_redis: Redis, key: str) -> None:
    """Overwritten between renewals and the body ends first: the exit must not DEL by key."""
    lease = aqw.Lease(lease_redis, key, ttl=5.0)  # renewals every 1.7 s: none during the body
    async with lease:
        await lease_redis.set(key, "other-token", px=10_000)
    assert await lease_redis.get(key) == b"other-token"
    assert await lease.release() is False


async def test_fencing_tokens_strictly_increase_across_holders(
    lease_redis: Redis, key: str
) -> None:
    tokens: list[int] = []
    for _ in range(20):
        async with aqw.Lease(lease_redis, key, ttl=5.0) as lease:
            tokens.append(lease.fencing_token)
    # a holder whose lease expired under it is followed by a higher token too
    stale = aqw.Lease(lease_redis, key, ttl=0.1, renew_every=0.09)
    await stale.acquire()
    tokens.append(stale.fencing_token)
    await asyncio.sleep(0.25)  # never renewed (acquired without entering): it expires
    async with aqw.Lease(lease_redis, key, ttl=5.0) as lease:
        tokens.append(lease.fencing_token)
    assert await stale.release() is False
    assert all(a < b for a, b in itertools.pairwise(tokens)), tokens
    assert tokens[0] > 0


async def test_cancelled_holder_leaves_no_orphaned_key(lease_redis: Redis, key: str) -> None:
    entered = asyncio.Event()

    async def hold() -> None:
        async with aqw.Lease(lease_redis, key, ttl=30.0):
            entered.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(hold())
    await entered.wait()
    assert await lease_redis.exists(key) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await lease_redis.exists(key) == 0
    # the next holder gets it at once
    async with aqw.Lease(lease_redis, key, ttl=5.0):
        pass


async def test_cancelled_while_acquiring_leaves_no_orphaned_key(
    redis_clients: Callable[[], Redis], key: str
) -> None:
    """Cancel at random moments of the acquire, connection set-up included (a fresh client
    each time). The cancellation must win, and no key may be left behind.

    On Python 3.11, ``asyncio.wait_for`` (used inside redis-py) can swallow a cancellation
    that races its result; the lease must still honour it."""
    rng = random.Random(7)
    observer = redis_clients()
    for i in range(60):
        client = redis_clients()

        async def take(client: Redis = client) -> None:
            async with aqw.Lease(client, key, ttl=30.0):
                await asyncio.sleep(60)

        task = asyncio.create_task(take())
        await asyncio.sleep(rng.uniform(0, 0.004))
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=3)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=3)
            pytest.fail(f"iteration {i}: the cancellation was swallowed; the lease body ran on")
        assert task.cancelled(), f"iteration {i}: {task!r}"
        # a release scheduled by the cancelled acquire may still be on its way
        await wait_until(lambda: _absent(observer, key), 1.0, "the cancelled acquirer's key to go")
        await client.aclose()


async def _absent(client: Redis, key: str) -> bool:
    return await client.exists(key) == 0


# -- renewal that cannot reach Redis -------------------------------------------------------------


@pytest.mark.parametrize("renewer", ["own task", "keeper"])
async def test_renewal_against_a_killed_server_cancels_the_body(
    private_redis: PrivateRedis, queue_name: str, renewer: str
) -> None:
    client = Redis.from_url(private_redis.url)
    key = f"aqw:{{{queue_name}}}:lock:res"
    keeper = aqw.LeaseKeeper() if renewer == "keeper" else None
    lease = aqw.Lease(client, key, ttl=TTL, keeper=keeper)
    finished = False
    killed_at = 0.0
    try:
        with pytest.raises(aqw.LeaseLost) as info:
            async with lease:
                await asyncio.sleep(TTL)  # a few renewals succeed
                assert lease.renewals >= 1
                private_redis.kill()
                killed_at = time.monotonic()
                await asyncio.sleep(20 * TTL)
                finished = True
        elapsed = time.monotonic() - killed_at
    finally:
        if keeper is not None:
            await keeper.close()
        await client.aclose()
    assert not finished
    # lost at the latest when the last confirmed expiry passes (< one ttl after the kill),
    # and leaving the block (a release attempt against a dead server) is bounded too
    assert elapsed < TTL + 1.0, f"left the block {elapsed:.2f}s after the server died"
    assert "expired" in str(info.value)


@pytest.mark.parametrize("renewer", ["own task", "keeper"])
async def test_renewal_through_a_blackholed_link_cancels_the_body(
    private_redis: PrivateRedis, queue_name: str, renewer: str
) -> None:
    proxy = await TcpProxy("127.0.0.1", private_redis.port).start()
    client = Redis.from_url(proxy.url)  # the defaults a user gets: socket_timeout 5 s, retries
    key = f"aqw:{{{queue_name}}}:lock:res"
    keeper = aqw.LeaseKeeper() if renewer == "keeper" else None
    lease = aqw.Lease(client, key, ttl=TTL, keeper=keeper)
    finished = False
    cut_at = 0.0
    try:
        with pytest.raises(aqw.LeaseLost) as info:
            async with lease:
                await asyncio.sleep(TTL)
                assert lease.renewals >= 1
                proxy.mode = "blackhole"
                cut_at = time.monotonic()
                await asyncio.sleep(20 * TTL)
                finished = True
        elapsed = time.monotonic() - cut_at
    finally:
        if keeper is not None:
            await keeper.close()
        await client.aclose()
        await proxy.aclose()
    assert not finished
    assert elapsed < TTL + 1.0, f"left the block {elapsed:.2f}s after the link went dark"
    assert "expired" in str(info.value)


# -- the shared keeper ---------------------------------------------------------------------------


async def test_keeper_renews_many_leases_and_cancels_on_loss(
    lease_redis: Redis, queue_name: str
) -> None:
    keeper = aqw.LeaseKeeper()
    keys = [f"aqw:{{{queue_name}}}:lock:k{i}" for i in range(10)]
    victim = keys[3]
    outcomes: dict[str, str] = {}
    lost_at = 0.0
    cancelled_after = 0.0

    async def hold(k: str) -> None:
        nonlocal cancelled_after
        lease = aqw.Lease(lease_redis, k, ttl=TTL, keeper=keeper)
        try:
            async with lease:
                try:
                    await asyncio.sleep(5 * TTL)
                except asyncio.CancelledError:
                    cancelled_after = time.monotonic() - lost_at
                    raise
                assert await lease_redis.get(k) == lease.token.encode()
                outcomes[k] = "held"
        except aqw.LeaseLost:
            outcomes[k] = "lost"

    async def steal() -> None:
        nonlocal lost_at
        await asyncio.sleep(2 * TTL)
        await lease_redis.set(victim, "thief", px=10_000)
        lost_at = time.monotonic()

    try:
        await asyncio.gather(*(hold(k) for k in keys), steal())
    finally:
        await keeper.close()
    assert outcomes == {k: ("lost" if k == victim else "held") for k in keys}
    assert 0 < cancelled_after < TTL
    assert len(keeper) == 0
    assert await lease_redis.get(victim) == b"thief"
    assert sum([await lease_redis.exists(k) for k in keys]) == 1


# -- arguments -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ttl": 0},
        {"ttl": -1.0},
        {"wait": -0.1},
        {"ttl": 1.0, "renew_every": 0},
        {"ttl": 1.0, "renew_every": 1.0},
        {"ttl": 1.0, "renew_every": 2.0},
        {"key": ""},
    ],
)
async def test_bad_arguments_raise_config_error(
    lease_redis: Redis, key: str, kwargs: dict[str, object]
) -> None:
    args: dict[str, object] = {"key": key, **kwargs}
    with pytest.raises(aqw.ConfigError):
        aqw.Lease(lease_redis, **args)  # type: ignore[arg-type]
    assert await lease_redis.exists(key) == 0


async def test_a_lease_is_acquired_once(lease_redis: Redis, key: str) -> None:
    lease = aqw.Lease(lease_redis, key, ttl=5.0)
    async with lease:
        pass
    with pytest.raises(RuntimeError):
        await lease.acquire()


# -- one deadline timer per keeper --------------------------------------------------------------
# A keeper's leases share one timer at the earliest confirmed expiry: each lease is still
# stopped at its own expiry, even when renewals never answer and the loop was blocked.


class SilentBackend:
    """Takes any key; renewals never answer (a server gone quiet)."""

    async def acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        return 1

    async def renew(self, key: str, token: str, ttl_ms: int) -> bool:
        await asyncio.Event().wait()
        return True

    async def release(self, key: str, token: str) -> bool:
        return True


async def test_a_block_waiting_forever_is_stopped_at_its_expiry() -> None:
    keeper = aqw.LeaseKeeper()
    loop = asyncio.get_running_loop()
    ttl = 0.3
    began = loop.time()
    with pytest.raises(aqw.LeaseLost):
        async with asyncio.timeout(60), aqw.Lease(SilentBackend(), "k", ttl=ttl, keeper=keeper):
            await asyncio.Event().wait()
    assert loop.time() - began >= ttl - 0.001  # at its expiry, not before
    await keeper.close()


async def test_leases_of_different_ttls_each_stop_at_their_own_expiry() -> None:
    keeper = aqw.LeaseKeeper()
    loop = asyncio.get_running_loop()
    began = loop.time()
    ended: dict[float, float] = {}

    async def hold(ttl: float) -> None:
        with pytest.raises(aqw.LeaseLost):
            async with aqw.Lease(SilentBackend(), f"k{ttl}", ttl=ttl, keeper=keeper):
                await asyncio.Event().wait()
        ended[ttl] = loop.time() - began

    long = asyncio.create_task(hold(0.8))
    await asyncio.sleep(0.05)
    await asyncio.gather(long, hold(0.2))  # the shorter one arrives later, due earlier
    assert 0.2 <= ended[0.2] < 0.45 + 0.05 and 0.8 <= ended[0.8] < 1.2, ended
    await keeper.close()


async def test_after_a_blocked_loop_the_block_is_stopped_before_its_own_later_timer() -> None:
    keeper = aqw.LeaseKeeper()
    ran_after: list[bool] = []
    with pytest.raises(aqw.LeaseLost):
        async with aqw.Lease(SilentBackend(), "k", ttl=0.3, keeper=keeper) as lease:

            async def block_loop() -> None:
                time.sleep(0.6)  # noqa: ASYNC251 - the loop blocked past the expiry

            blocker = asyncio.create_task(block_loop())
            await asyncio.sleep(0.5)  # due after the expiry: must not resume normally
            ran_after.append(lease.held)
    await blocker
    assert ran_after == []
    await keeper.close()
