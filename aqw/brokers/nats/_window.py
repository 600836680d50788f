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
