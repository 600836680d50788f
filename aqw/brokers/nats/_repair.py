"""What a SIGKILLed nats-server can leave in a work-queue stream, put right.

A server killed without a clean shutdown restores a stream and each of its consumers from
files written at different moments. Measured on 2.9.10 (``docs/brokers/nats.md``, "What a
killed server leaves"), two things can come back wrong, and nothing in the server mends
either:

- **ack-pending entries for messages that are gone**: the consumer's state is older than
  the stream's, so it still waits for an ack of a message the stream removed when it was
  acked. The server never redelivers such an entry (there is nothing to deliver) and never
  drops it: ``depth()`` counted it in flight for good, and it holds the ack floor down.
- **messages the consumer had acked** (the stream's state older than the consumer's): at or
  below the ack floor, so never delivered again, but still in the stream.

``Repairer.run`` clears both and touches nothing a worker may still hold:

- an ack is sent only for a sequence in the consumer's pending range (above its ack floor,
  at most its last delivered and the stream's last) that holds **no message at all**: no
  job can be lost by it (there is none). Not "no message on the consumer's subject": a
  work-queue stream removes the message of any sequence a consumer acks, pending or not,
  even one not yet delivered (measured on 2.9.10), and the sequence may hold another
  priority level's job;
- a purge removes only messages **at or below the ack floor**: every one of them was acked
  by this consumer (with a work queue a message is the consumer's alone), so each job had
  settled.

Cost when nothing is wrong: per consumer, its info, a look at the first message of its
subject and, while deliveries are in flight, the subject's message count (the walk over
the pending range runs only when that count is short of what the consumer says it holds,
its ack floor has not moved for ``STUCK_RUNS`` runs, or the connection is back from an
outage):
run by each worker at most once every ``REPAIR_EVERY`` seconds, and soon after its
connection comes back from an outage.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from nats.aio.client import Client
from nats.js import JetStreamContext

#: Seconds between two repairs by one worker when no outage asked for one sooner.
REPAIR_EVERY = 30.0

#: The most acks one repair sends for one consumer (a gap of gone sequences can be long:
#: every sequence between a stuck entry and the last delivery); the next repair goes on.
MOST_ACKS = 20_000

#: The most messages one repair looks up in one consumer's pending range (one request each:
#: those in flight, and acked ones left above the floor).
MOST_LOOKS = 2_000

#: Runs of the repair a consumer's ack floor may stay where it is, deliveries in flight,
#: before its pending range is walked although its counts agree (a long job holds the
#: floor as an entry of a gone message does).
STUCK_RUNS = 4

#: Seconds a repair waits for each answer of the server.
ANSWER = 4.0


@dataclass(frozen=True, slots=True)
class Part:
    """One durable consumer of a work-queue stream, and the subject it takes."""

    stream: str
    consumer: str
    subject: str


@dataclass(slots=True)
class Repaired:
    """What one repair did: ack-pending entries cleared, acked messages purged."""

    cleared: int = 0
    purged: int = 0

    def __bool__(self) -> bool:
        return bool(self.cleared or self.purged)


async def _next_message(nc: Client, part: Part, seq: int, subject: str = ">") -> int | None:
    """The sequence of the first message at or after ``seq`` in ``part``'s stream (on
    ``subject``: any by default), or None when there is none."""
    request = json.dumps({"seq": seq, "next_by_subj": subject}).encode()
    reply = await nc.request(f"$JS.API.STREAM.MSG.GET.{part.stream}", request, timeout=ANSWER)
    answer = json.loads(reply.data)
    if "error" in answer:
        if answer["error"].get("code") == 404:
            return None
        raise RuntimeError(f"{part.stream}: {answer['error'].get('description', answer)}")
    return int(answer["message"]["seq"])


async def _clear_gone(nc: Client, part: Part, floor: int, last: int) -> int:
    """Ack every sequence in (``floor``, ``last``] that holds no message (at most
    ``MOST_ACKS``); the count sent."""
    sent, seq, looks = 0, floor + 1, 0
    ack = f"$JS.ACK.{part.stream}.{part.consumer}.1"
    while seq <= last and sent < MOST_ACKS and looks < MOST_LOOKS:
        found = await _next_message(nc, part, seq)
        looks += 1
        upto = last + 1 if found is None else min(found, last + 1)
        for gone in range(seq, min(upto, seq + MOST_ACKS - sent)):
            # $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ts>.<left>:
            # the server finds the pending entry by its stream sequence.
            await nc.publish(f"{ack}.{gone}.0.0.0", b"+ACK")
            sent += 1
        seq = upto + 1
    if sent:
        await nc.flush(timeout=int(ANSWER))
    return sent


class Repairer:
    """``run(parts)``: each part's acked messages purged, then its ack-pending entries of
    gone messages cleared. It remembers how many runs each consumer's ack floor has not
    moved while deliveries were in flight: a floor stuck ``STUCK_RUNS`` runs is walked
    too."""

    def __init__(self, nc: Client, js: JetStreamContext) -> None:
        self._nc = nc
        self._js = js
        self._floors: dict[Part, tuple[int, int]] = {}  # (floor, runs it has not moved)
        self._walk = False  # the next run walks every part with deliveries in flight

    def after_outage(self) -> None:
        """The connection is back: the server may have been killed and restarted, its
        consumers restored with entries of messages gone (and acked messages above them
        hiding the shortfall), so the next run walks every pending range."""
        self._walk = True

    async def run(self, parts: Sequence[Part], purge: bool = True) -> Repaired:
        """``purge``: whether acked messages are purged (not when the consumers have a
        ``MaxDeliver``: a message the server gave up on stays below the floor too, and
        only aqw's own dead-lettering may end a job that did not finish)."""
        total, walk, self._walk = Repaired(), self._walk, False
        for part in parts:
            done = await self.part(part, purge, walk)
            total.cleared += done.cleared
            total.purged += done.purged
        return total

    def _stuck(self, part: Part, floor: int, in_flight: bool) -> bool:
        last, runs = self._floors.get(part, (-1, 0))
        runs = runs + 1 if in_flight and floor == last else 0
        self._floors[part] = (floor, runs)
        return runs >= STUCK_RUNS

    async def part(self, part: Part, purge: bool = True, walk: bool = False) -> Repaired:
        nc, js, done = self._nc, self._js, Repaired()
        info = await js.consumer_info(part.stream, part.consumer)
        floor = int(info.ack_floor.stream_seq or 0) if info.ack_floor else 0
        first = await _next_message(nc, part, 1, part.subject) if floor and purge else None
        if first is not None and first <= floor:
            before = await _count(js, part)
            await js.purge_stream(part.stream, seq=floor + 1, subject=part.subject)
            done.purged = max(0, before - await _count(js, part))
        pending = int(info.num_ack_pending or 0)
        stuck = self._stuck(part, floor, pending > 0) or walk
        if not pending:
            return done
        # With a work queue the subject holds the messages not yet delivered and those in
        # flight (and any acked ones above the floor): fewer means some entries are of
        # messages gone. (Read after the consumer's counts: an ack between the two reads
        # makes a walk that finds nothing, never a missed one.) Acked messages above the
        # floor can hide that shortfall, and an entry of a gone message holds the floor
        # where it is: a floor stuck a few runs is walked too.
        held = int(info.num_pending or 0) + pending
        if not stuck and await _count(js, part) >= held:
            return done
        last = int(info.delivered.stream_seq or 0) if info.delivered else 0
        stream = await js.stream_info(part.stream)  # a stream restored older ends sooner
        last = min(last, int(stream.state.last_seq or 0))
        acks = await _clear_gone(nc, part, floor, last)
        if acks:
            # Most of those sequences were simply acked before; what the walk cleared is
            # what it took off the ack-pending count (a settle meanwhile counts too: the
            # walk takes a few milliseconds).
            after = await js.consumer_info(part.stream, part.consumer)
            done.cleared = min(acks, max(0, pending - int(after.num_ack_pending or 0)))
        return done


async def _count(js: JetStreamContext, part: Part) -> int:
    """The messages ``part``'s subject holds."""
    info = await js.stream_info(part.stream, subjects_filter=part.subject)
    return int((info.state.subjects or {}).get(part.subject, 0))
