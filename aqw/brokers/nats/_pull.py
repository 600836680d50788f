"""A pull that is over on the server before it returns (``NoWaitPull``), for the promoter.

nats-py's ``fetch(batch, timeout)`` sends its pull requests with an ``expires`` that the
server counts from when the request *arrives*, while the client stops waiting ``timeout``
after it *sent* it; and nats-server 2.9 keeps a ``no_wait`` request that has an
``expires`` waiting for its whole batch (nats-py's own comment says so). So a fetch often
returns while its request is still open on the server, and a message the server hands out
meanwhile (a nak'd delivery whose delay has just run out) goes into that subscription's
buffer, unseen until that subscription fetches again; in a process that does not (a worker
stopped, its connection still open), it waits out the consumer's AckWait.
``docs/brokers/nats.md`` ("Why a promoter pass asks without waiting") has the measurement.

A ``no_wait`` request without ``expires`` is answered at once on 2.9.10: what is there (at
most ``batch``), then a status (404 No Messages, or 408 after the messages), and nothing
is left waiting. Each pull reads its answer on an inbox of its own, unsubscribed after."""

from __future__ import annotations

import contextlib
import json
import time

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

#: The header a status reply carries (100 heartbeat, 404, 408, 409).
STATUS = "Status"


class NoWaitPull:
    """``take(batch)``: the messages of consumer ``consumer`` of ``stream`` there now."""

    def __init__(self, nc: Client, stream: str, consumer: str) -> None:
        self._nc = nc
        self._api = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"

    async def take(self, batch: int, timeout: float) -> list[Msg]:
        """Up to ``batch`` messages, without waiting for any; ``timeout`` bounds the wait
        for the server's answer (what came by then is returned)."""
        nc = self._nc
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        msgs: list[Msg] = []
        try:
            request = json.dumps({"batch": batch, "no_wait": True}).encode()
            await nc.publish(self._api, request, reply=inbox)
            deadline = time.monotonic() + timeout
            while len(msgs) < batch:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    msg = await sub.next_msg(timeout=left)
                except nats.errors.TimeoutError:
                    break
                status = (msg.headers or {}).get(STATUS)
                if status is None:
                    msgs.append(msg)
                elif status != "100":  # not a heartbeat: the request is over
                    break
        finally:
            with contextlib.suppress(
                nats.errors.ConnectionClosedError, nats.errors.BadSubscriptionError
            ):
                await sub.unsubscribe()
        return msgs
