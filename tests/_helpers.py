"""Small helpers shared by the tests."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aqw


async def eventually(pred: Callable[[], Any], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while True:
        value = pred()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.01)


async def depth(app: aqw.App) -> tuple[int, int, int, int]:
    d = await app.broker.depth()
    return (d.waiting, d.in_flight, d.delayed, d.dead)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (never the shared 6379)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    assert port != 6379
    return port


def redis_pings(port: int) -> bool:
    """True when a Redis server on 127.0.0.1:``port`` answers PING."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False
