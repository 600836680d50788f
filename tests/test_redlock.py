"""RedlockBackend against three real, throwaway redis-server processes.

Each test starts its own servers on free loopback ports (never the shared one on 6379) and
kills them in teardown, so servers can be killed or frozen mid-lease.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from conftest import PrivateRedis
from redis.asyncio import Redis

from aqw.errors import ConfigError, LeaseLost, LeaseUnavailable
from aqw.lease import Lease
from aqw.lease.redlock import RedlockBackend

pytestmark = pytest.mark.timeout(30)

TTL = 0.6  # seconds; renewals every 0.2 s


class RedisNodes:
    """Independent redis-server processes on loopback, one per port."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.servers: list[PrivateRedis] = []

    @property
    def ports(self) -> list[int]:
        return [server.port for server in self.servers]

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    def start(self, count: int) -> None:
        for index in range(count):
            node_dir = self.workdir / f"node{index}"
            node_dir.mkdir(exist_ok=True)
            server = PrivateRedis(node_dir)
            server.start()
            self.servers.append(server)

    def kill(self, index: int) -> None:
        self.servers[index].kill()

    def freeze(self, index: int) -> None:
        """SIGSTOP: the server still accepts TCP connections but never answers."""
        proc = self.servers[index].proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGSTOP)

    def stop_all(self) -> None:
        for server in self.servers:
            server.kill()


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[RedisNodes]:
    servers = RedisNodes(tmp_path)
    try:
        servers.start(3)
        yield servers
    finally:
        servers.stop_all()


@pytest.fixture
async def backend(nodes: RedisNodes) -> AsyncIterator[RedlockBackend]:
    redlock = RedlockBackend.from_urls(nodes.urls)
    try:
        yield redlock
    finally:
        await redlock.close()


@pytest.fixture
def key() -> str:
    return f"test:redlock:{uuid.uuid4().hex}"


async def _values(backend: RedlockBackend, key: str, indexes: range | list[int]) -> list[object]:
    return [await backend.clients[i].get(key) for i in indexes]


async def _refused(backend: RedlockBackend, key: str, wait: float = 0.0) -> bool:
    try:
        async with Lease(backend, key, ttl=TTL, wait=wait):
            return False
    except LeaseUnavailable:
        return True


# -- acquire / release ----------------------------------------------------------------------


async def test_acquire_and_release_on_every_node(backend: RedlockBackend, key: str) -> None:
    async with Lease(backend, key, ttl=5) as lease:
        assert lease.fencing_token >= 1
        assert await _values(backend, key, range(3)) == [lease.token.encode()] * 3
    assert await _values(backend, key, range(3)) == [None, None, None]

    fence = await backend.acquire(key, "tok", 5000)
    assert fence is not None and fence > lease.fencing_token
    assert await backend.release(key, "tok") is True
    assert await backend.release(key, "tok") is False  # no longer ours anywhere


async def test_second_acquirer_is_refused_while_held(backend: RedlockBackend, key: str) -> None:
    async with Lease(backend, key, ttl=5) as first:
        assert await _refused(backend, key)
        with pytest.raises(LeaseUnavailable) as info:
            async with Lease(backend, key, ttl=5, wait=0.3):
                pytest.fail("a second holder entered the lease")
        assert info.value.waited >= 0.3  # it tried for its whole wait, then gave up
        # The refused attempts left the holder's keys alone.
        assert await _values(backend, key, range(3)) == [first.token.encode()] * 3
    async with Lease(backend, key, ttl=5) as second:
        assert second.fencing_token > first.fencing_token


async def test_minority_holder_does_not_block_but_majority_does(
    backend: RedlockBackend, key: str
) -> None:
    await backend.clients[0].set(key, "foreign", px=10_000)
    fence = await backend.acquire(key, "mine", 5000)
    assert fence is not None
    assert await _values(backend, key, range(3)) == [b"foreign", b"mine", b"mine"]
    assert await backend.release(key, "mine") is True
    assert await _values(backend, key, range(3)) == [b"foreign", None, None]

    await backend.clients[1].set(key, "foreign", px=10_000)
    assert await backend.acquire(key, "mine", 5000) is None
    # The node that did grant it was released again: nothing of ours is left behind.
    assert await _values(backend, key, range(3)) == [b"foreign", b"foreign", None]


async def test_no_lease_without_validity_time(nodes: RedisNodes, key: str) -> None:
    # drift = 100 ms * 0.99 + 2 ms > ttl: a quorum grants it but no validity time is left.
    redlock = RedlockBackend.from_urls(nodes.urls, clock_drift_factor=0.99)
    try:
        assert await redlock.acquire(key, "tok", 100) is None
        assert await _values(redlock, key, range(3)) == [None, None, None]
        assert await redlock.acquire(key, "tok", 10_000) is not None
    finally:
        await redlock.close()


# -- renewal and node failures ----------------------------------------------------------------


async def test_renewal_keeps_the_lease_past_several_ttls(backend: RedlockBackend, key: str) -> None:
    async with Lease(backend, key, ttl=TTL, wait=10.0) as lease:  # a slow first quorum: again
        await asyncio.sleep(4 * TTL)
        assert await _refused(backend, key)
        # a quorum holds it (a node whose renewal missed its per-node timeout on a loaded
        # machine may have let its copy expire: the lease stands on the other two)
        values = await _values(backend, key, range(3))
        assert values.count(lease.token.encode()) >= 2, values
        assert set(values) <= {lease.token.encode(), None}, values
    assert lease.lost_reason is None
    # One every ttl/3 (~12 in 4 ttls); keys alive after 4 ttls need 3 at least.
    assert lease.renewals >= 3


async def test_lease_survives_one_node_killed(
    nodes: RedisNodes, backend: RedlockBackend, key: str
) -> None:
    completed = False
    async with Lease(backend, key, ttl=TTL, wait=10.0) as lease:  # a slow first quorum: again
        await asyncio.sleep(TTL / 2)
        nodes.kill(0)
        renewals_at_kill = lease.renewals
        await asyncio.sleep(4 * TTL)
        assert await _refused(backend, key)  # still exclusive on the two survivors
        assert await _values(backend, key, [1, 2]) == [lease.token.encode()] * 2
        completed = True
    assert completed
    assert lease.lost_reason is None
    assert lease.renewals - renewals_at_kill >= 3  # held 4 ttls past the kill: renewed


async def test_lease_lost_when_two_nodes_killed(
    nodes: RedisNodes, backend: RedlockBackend, key: str
) -> None:
    events: list[str] = []
    killed_at = 0.0
    with pytest.raises(LeaseLost) as info:
        async with Lease(backend, key, ttl=TTL, wait=10.0) as lease:  # a slow first quorum: again
            await asyncio.sleep(TTL / 4)
            nodes.kill(0)
            nodes.kill(1)
            killed_at = time.monotonic()
            try:
                await asyncio.sleep(10 * TTL)
                events.append("finished")
            except asyncio.CancelledError:
                events.append("cancelled")
                raise
    lost_after = time.monotonic() - killed_at
    assert events == ["cancelled"]
    assert info.value.key == key
    assert lease.lost_reason is not None
    assert lost_after < TTL + 0.2, f"lease lost only {lost_after:.3f}s after the quorum died"
    # Released on the surviving node on the way out.
    assert await backend.clients[2].get(key) is None


async def test_unresponsive_node_is_bounded_by_per_node_timeout(
    nodes: RedisNodes, key: str
) -> None:
    # Default clients: 5 s socket timeouts and redis-py's retries with backoff. Only the
    # per-node timeout keeps a frozen server from stalling acquire and renewals.
    redlock = RedlockBackend([Redis(host="127.0.0.1", port=port) for port in nodes.ports])
    try:
        assert await redlock.acquire(key, "warm-up", 1000) is not None  # pooled connections
        assert await redlock.release(key, "warm-up")
        nodes.freeze(0)  # accepts connections, never answers
        # A grant counts only with validity time left: an acquire that waited for the frozen
        # node's socket timeout (5 s) would have none of its 0.6 s, and a renewal that did
        # would lose the lease. Entering it and keeping it for 3 ttls shows neither waited.
        async with Lease(redlock, key, ttl=TTL) as lease:
            await asyncio.sleep(3 * TTL)
            assert await _values(redlock, key, [1, 2]) == [lease.token.encode()] * 2
        assert lease.lost_reason is None
        assert lease.renewals >= 2
    finally:
        nodes.kill(0)  # a frozen server would make closing its connection wait
        await redlock.close()


async def test_acquire_fails_cleanly_with_one_node_up(
    nodes: RedisNodes, backend: RedlockBackend, key: str
) -> None:
    nodes.kill(0)
    nodes.kill(1)
    attempts = 0
    send = backend.acquire

    async def acquire(key: str, token: str, ttl_ms: int) -> int | None:
        nonlocal attempts
        attempts += 1
        return await send(key, token, ttl_ms)

    backend.acquire = acquire  # type: ignore[method-assign]
    with pytest.raises(LeaseUnavailable):
        async with Lease(backend, key, ttl=5):
            pytest.fail("entered a lease without a quorum")
    assert attempts == 1  # refused on the first try, without waiting
    assert await backend.clients[2].get(key) is None  # the lone grant was released


async def test_all_nodes_down_never_raises(nodes: RedisNodes, backend: RedlockBackend) -> None:
    nodes.stop_all()
    assert await backend.acquire("k", "tok", 1000) is None
    assert await backend.renew("k", "tok", 1000) is False
    assert await backend.release("k", "tok") is False


# -- fencing ----------------------------------------------------------------------------------


async def test_fencing_tokens_strictly_increase_across_holders(
    backend: RedlockBackend, key: str
) -> None:
    tokens = []
    for _ in range(6):
        async with Lease(backend, key, ttl=5) as lease:
            tokens.append(lease.fencing_token)
    assert tokens == sorted(set(tokens)), tokens


async def test_fencing_tokens_increase_when_counters_diverge(
    nodes: RedisNodes, backend: RedlockBackend, key: str
) -> None:
    # Node 0's counter ran ahead (e.g. acquirers that reached only it). The holder's token is
    # the maximum; the next holder, on a quorum without node 0, must still get a larger one.
    await backend.clients[0].set(backend.fence_key(key), 100)
    async with Lease(backend, key, ttl=5) as first:
        pass
    assert first.fencing_token == 101
    nodes.kill(0)
    async with Lease(backend, key, ttl=5) as second:
        pass
    assert second.fencing_token > first.fencing_token


# -- configuration ----------------------------------------------------------------------------


async def test_from_urls_builds_fail_fast_clients(nodes: RedisNodes) -> None:
    redlock = RedlockBackend.from_urls(nodes.urls, per_node_timeout=0.1)
    try:
        assert redlock.quorum == 2
        assert redlock.per_node_timeout == 0.1
        for client in redlock.clients:
            kwargs = client.connection_pool.connection_kwargs
            assert kwargs["socket_timeout"] == 0.2
            assert kwargs["socket_connect_timeout"] == 0.2
            assert kwargs["retry"].get_retries() == 0
            assert await client.ping()
    finally:
        await redlock.close()


async def test_config_errors() -> None:
    with pytest.raises(ConfigError):
        RedlockBackend([])
    client = Redis()  # never connects
    try:
        with pytest.raises(ConfigError):
            RedlockBackend([client], clock_drift_factor=1.5)
        with pytest.raises(ConfigError):
            RedlockBackend([client], per_node_timeout=0)
        assert RedlockBackend([client]).quorum == 1
        assert RedlockBackend([client] * 4).quorum == 3
    finally:
        await client.aclose()
