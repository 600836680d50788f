"""The ack window of one delivery, as this consumer knows it: a JetStream message is this
consumer's only until ``AckWait`` after the server last heard of it (the delivery, or a
``+WPI`` in-progress ack), and the server takes an ack after that too, when it has already
redelivered the message to someone else. So aqw keeps each delivery's **confirmed end**:
the send time of the fetch that got it, or of its last in-progress ack the server replied
to, plus AckWait (the server's clock starts later than the send, so the end is early, never
late), and refuses every renewal and settle once it is near (``margin``: the settle must
reach the server before it). A worker paused (SIGSTOP, a VM stall) past the end finds it
passed when it resumes: its ack is never sent."""

from __future__ import annotations

import time
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from ..messages import Delivery

#: The header of a job's message naming the revision of its record as its producer wrote it
#: (``KvJobRecords.enqueued``): the job's start writes the record against it, without a read.
RECORD_REVISION = "Aqw-Record-Revision"


@dataclass(slots=True)
class Held:
    """A delivery held by this consumer: the message (its reply subject acks it), its
    delivery count, and the confirmed end of its window (``time.monotonic()``)."""

    msg: Msg
    count: int
    ends: float

    def open(self, margin: float) -> bool:
        return time.monotonic() + margin < self.ends


def margin_of(ack_wait: float) -> float:
    """Seconds before a window's end after which nothing is sent for it: a tenth of the
    window, from 50 ms to 1 s."""
    return max(0.05, min(1.0, ack_wait / 10))


class Windows:
    """The deliveries this consumer holds, by id, each with its window's confirmed end."""

    __slots__ = ("_held", "_stale", "ack_wait", "margin")

    def __init__(self, ack_wait: float) -> None:
        self._held: dict[str, Held] = {}
        self._stale = (0.0, 0.0)  # (sent, open until) of a cancelled fetch's pull request
        self.ack_wait = ack_wait
        self.margin = margin_of(ack_wait)

    def set_ack_wait(self, ack_wait: float) -> None:
        self.ack_wait = ack_wait
        self.margin = margin_of(ack_wait)

    def cancelled(self, sent: float, wait: float) -> None:
        """A fetch sent at ``sent`` was cancelled: its pull request stays open on the server
        up to ``wait`` seconds, and a message it brings later is handed out by the next
        fetch, its window counted from this send."""
        self._stale = (sent, sent + wait)

    def received(self, msgs: list[Msg], sent: float) -> list[Delivery]:
        """The deliveries of a fetch sent at ``sent``."""
        stale_sent, stale_until = self._stale
        start = min(sent, stale_sent) if stale_until >= sent else sent
        out: list[Delivery] = []
        for msg in msgs:
            meta = msg.metadata
            entry_id, count = str(meta.sequence.stream), meta.num_delivered
            held = Held(msg, count, start + self.ack_wait)
            self._held[entry_id] = held
            delivery = Delivery(entry_id, msg.data, delivery_count=count, receipt=held)
            revision = msg.headers.get(RECORD_REVISION) if msg.headers else None
            if revision is not None:
                delivery.attributes[RECORD_REVISION] = revision
            out.append(delivery)
        return out

    def hold(self, delivery: Delivery) -> Held | None:
        """The delivery while it is this consumer's and its window is open."""
        held = self._held.get(delivery.id)
        if held is None or held.count != delivery.delivery_count:
            return None
        if not held.open(self.margin):
            del self._held[delivery.id]
            return None
        return held

    def left(self, held: Held) -> float:
        """Seconds a renewal sent now has to reach the server."""
        return held.ends - self.margin - time.monotonic()

    def renewed(self, held: Held, sent: float) -> None:
        held.ends = sent + self.ack_wait

    def drop(self, delivery: Delivery) -> None:
        self._held.pop(delivery.id, None)

    def unstarted(self, running: set[str]) -> list[Delivery]:
        return [
            Delivery(i, h.msg.data, delivery_count=h.count)
            for i, h in self._held.items()
            if i not in running
        ]


async def _fetch(sub: JetStreamContext.PullSubscription, count: int, wait: float) -> list[Msg]:
    try:
        return await sub.fetch(count, timeout=wait)
    except TimeoutError:  # nats.errors.TimeoutError is one: nothing came
        return []


async def pull(sub: JetStreamContext.PullSubscription, count: int, block: float) -> list[Msg]:
    """One message, waited for up to ``block`` seconds, and up to ``count - 1`` more of what
    is waiting with it (a pull of ``count`` messages waits out its whole block for the batch
    to fill: at a low rate every job would wait that long)."""
    msgs = await _fetch(sub, 1, max(block, 0.01))
    if msgs and count > 1:
        msgs += await _fetch(sub, count - 1, 0.01)
    return msgs
