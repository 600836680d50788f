"""A tiny asyncio TCP proxy for fault injection (no toxiproxy here).

``mode`` is one of:

- ``"pass"``: forward bytes both ways;
- ``"blackhole"``: keep connections open but drop every byte in both directions, so a client
  waits for replies that never come (a network partition, or a frozen server);
- ``"refuse"``: close new connections at once (connection reset on connect).

``latency`` (seconds) delays every chunk forwarded from client to server, in order;
``slow = (pattern, seconds)`` delays only the chunks that contain ``pattern`` (and, to keep
the order, what follows them on the same connection); ``stalls = (share, seconds)`` holds
that share of the chunks, in either direction, that much longer (and what follows them on
the same connection, as TCP does with a lost segment), drawn from ``random`` (seed it).
:meth:`cut` closes every open connection (a connection reset mid-stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import random


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.mode = "pass"
        self.latency = 0.0
        self.slow: tuple[bytes, float] | None = None
        self.stalls: tuple[float, float] | None = None
        self.random = random.Random(0)
        self.stalled = 0  # chunks held by ``stalls``
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._downstream: set[asyncio.StreamWriter] = set()
        self._pumps: set[asyncio.Task[None]] = set()
        self.connections = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "refuse":
            writer.close()
            return
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        self._downstream.add(writer)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            pump = asyncio.get_running_loop().create_task(self._pump(src, dst))
            self._pumps.add(pump)
            pump.add_done_callback(self._pumps.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        upstream = dst not in self._downstream
        lagged: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        sender = asyncio.get_running_loop().create_task(self._send_lagged(lagged, dst))
        self._pumps.add(sender)
        sender.add_done_callback(self._pumps.discard)
        try:
            while True:
                data = await src.read(65536)
                if not data:
                    break
                if self.mode != "pass":
                    continue  # blackhole: read and drop
                delay = self.latency if upstream else 0.0
                if upstream and self.slow is not None and self.slow[0] in data:
                    delay = max(delay, self.slow[1])
                if self.stalls is not None and self.random.random() < self.stalls[0]:
                    self.stalled += 1
                    delay += self.stalls[1]
                lagged.put_nowait((asyncio.get_running_loop().time() + delay, data))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            lagged.put_nowait(None)  # like a FIN: what was sent before still arrives

    async def _send_lagged(
        self, lagged: asyncio.Queue[tuple[float, bytes] | None], dst: asyncio.StreamWriter
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while (item := await lagged.get()) is not None:
                due, data = item
                await asyncio.sleep(max(0.0, due - loop.time()))
                if self.mode == "pass":
                    dst.write(data)
                    await dst.drain()
        except OSError:
            pass
        finally:
            self._close(dst)

    def _close(self, writer: asyncio.StreamWriter) -> None:
        self._writers.discard(writer)
        self._downstream.discard(writer)
        with contextlib.suppress(Exception):
            writer.close()

    def cut(self) -> None:
        """Reset every open connection."""
        for writer in list(self._writers):
            self._close(writer)

    async def aclose(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for pump in list(self._pumps):
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        # let transports finish closing so no ResourceWarning escapes
        await asyncio.sleep(0)
