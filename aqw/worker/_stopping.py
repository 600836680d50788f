"""How a worker stops when told to: the first SIGINT or SIGTERM asks for a graceful stop
(running jobs get their grace period), a second one cuts it short: the running jobs are
cancelled at once and handed back to the queue for immediate redelivery, never acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from .._text import plural
from ._slots import Slots

log = logging.getLogger("aqw.worker")


class Stopping:
    """The stop requests of one worker: ``stop`` (set by the first signal, ``request_stop``
    or the end of a burst) and ``forced`` (set by a second signal)."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop
        self.forced = asyncio.Event()
        #: The first signal received (``aqw worker`` exits 130 after a SIGINT), or None.
        self.signal: signal.Signals | None = None

    def on_signal(self, sig: signal.Signals) -> None:
        """SIGINT/SIGTERM: the first stops gracefully, the next one at once."""
        self.signal = self.signal or sig
        if not self.stop.is_set():
            log.info(
                "received %s: stopping gracefully, running jobs may finish "
                "(send it again to stop at once)",
                sig.name,
            )
            self.stop.set()
            return
        if self.forced.is_set():
            log.info("received %s again: already stopping at once", sig.name)
            return
        log.warning(
            "received %s again: stopping at once; running jobs are cancelled and handed back "
            "to the queue (not acknowledged), to run again",
            sig.name,
        )
        self.forced.set()

    async def drain(self, slots: Slots, grace: float, within: float) -> None:
        """Let running jobs finish within ``grace`` seconds (cut short by ``forced``), then
        cancel the rest, again each second for up to ``within`` seconds: each hands itself
        back for immediate redelivery (a job already settling is left to finish)."""
        pending = set(slots.jobs)
        if not pending:
            return
        loop = asyncio.get_running_loop()
        started = loop.time()
        if not self.forced.is_set():
            log.info("waiting up to %.1fs for %s", grace, plural(len(pending), "running job"))
        forced = asyncio.ensure_future(self.forced.wait())
        try:
            while pending and not forced.done() and (left := started + grace - loop.time()) > 0:
                done, _ = await asyncio.wait(
                    {*pending, forced}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                pending -= done
        finally:
            forced.cancel()
        pending = {task for task in slots.jobs if not task.done()}
        if not pending:
            return
        await slots.cancel(pending, loop.time() - started, within)
        if self.forced.is_set():
            log.warning(
                "stopped at once: %s cancelled and handed back to the queue, not acknowledged",
                plural(len(pending), "running job"),
            )
