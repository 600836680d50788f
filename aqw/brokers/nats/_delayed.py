"""Jobs not due yet: scheduled jobs and retries wait in the queue's ``AQW_q_DELAYED``
stream, their due time (seconds since the epoch) in the ``Aqw-Due`` header, until
``promote_due`` moves them to the queue: a due one is published under ``Nats-Msg-Id``
``due.<seq>`` (a move repeated after a crash is dropped as a duplicate) then acked; one not
due yet is nak'd with a delay of the time left, so the server hands it back at its time, to
the next pass of any worker (a pass pulls without waiting: ``_pull.py``)."""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Awaitable, Callable, Sequence

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from ..local.priorities import level_of
from ._layout import Layout
from ._pull import NoWaitPull

#: The header of a delayed job's due time.
DUE = "Aqw-Due"

#: The header that marks a debounce timer (``_debounce.py``).
TIMER = "Aqw-Debounce"

#: A debounce timer's turn: None when done with (ack it), else the time it waits for now.
Timers = Callable[[bytes], Awaitable[float | None]]


def _due(msg: Msg) -> float:
    try:
        return float((msg.headers or {}).get(DUE, "0"))
    except ValueError:
        return 0.0


class Delayed:
    """The delayed stream's writes and its promoter (``promoter`` consumer)."""

    def __init__(self, js: JetStreamContext, names: Layout, pull: NoWaitPull, timers: Timers):
        self._js = js
        self._names = names
        self._pull = pull
        self._timers = timers
        #: Due times this process knows of, soonest first (what ``promote`` returns).
        self._dues: list[float] = []
        #: One pass at a time on the shared subscription (the workers of one broker).
        self._promoting = asyncio.Lock()

    async def add(self, data: Sequence[bytes], run_at: float, msg_id: str | None = None) -> None:
        names = self._names
        headers = {DUE: repr(run_at), **({"Nats-Msg-Id": msg_id} if msg_id else {})}
        for body in data:
            await self._js.publish(
                names.delayed_subject, body, stream=names.delayed_stream, headers=headers
            )
        heapq.heappush(self._dues, run_at)

    async def promote(self, reply_timeout: float) -> float | None:
        """Move the due jobs; seconds until the next known due time, or None. Each pass
        pulls what is there without waiting (``NoWaitPull``: nothing is left open on the
        server to take a delivery after the pass); the workers of one broker take turns."""
        async with self._promoting:
            return await self._promote(reply_timeout)

    async def _promote(self, reply_timeout: float) -> float | None:
        msgs = await self._pull.take(256, reply_timeout)
        now = time.time()
        names = self._names
        for msg in msgs:
            due = _due(msg)
            if due <= now and TIMER in (msg.headers or {}):
                later = await self._timers(msg.data)  # a debounce timer: its key decides
                if later is None:
                    await msg.ack_sync(timeout=reply_timeout)
                    continue
                await msg.nak(delay=max(0.001, later - time.time()))
                heapq.heappush(self._dues, later)
                continue
            if due > now:
                await msg.nak(delay=due - now)
                heapq.heappush(self._dues, due)
                continue
            seq = msg.metadata.sequence.stream
            subject = names.subject_for(level_of(msg.data))  # the job's own level
            headers = {"Nats-Msg-Id": f"due.{seq}"}
            await self._js.publish(subject, msg.data, stream=names.stream, headers=headers)
            await msg.ack_sync(timeout=reply_timeout)
        while self._dues and self._dues[0] <= now:
            heapq.heappop(self._dues)
        return max(0.0, self._dues[0] - now) if self._dues else None

    async def count(self) -> int:
        info = await self._js.stream_info(self._names.delayed_stream)
        return int(info.state.messages)
