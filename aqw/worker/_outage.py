"""One voice for a broker outage: the worker's loops (fetch, promote, reclaim, heartbeat) all
fail while the broker is unreachable, and each retries on its own; ``Outage`` turns their
failures into one warning when the broker stops answering, a reminder at a slow interval,
and one line when it answers again."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from .._text import printable

log = logging.getLogger("aqw.worker")

#: Seconds between the "still unreachable" reminders of one outage.
REMIND_EVERY = 30.0

#: An outage is said once calls have failed for this many seconds: a single failed call
#: that the next one retries successfully (a pooled connection the server closed while
#: idle, a straggler on the old connection just after a reconnect) is not an outage.
CONFIRM_AFTER = 1.0


class Outage:
    """The outage state of one worker's broker, shared by its loops.

    Each loop calls ``failed(what, exc)`` when a broker call fails with a transient error,
    and ``ok()`` when one succeeds. Once calls have failed for ``confirm_after`` seconds
    with none succeeding, one warning names the broker (``broker``, e.g.
    ``redis://host:6379/0 queue=q``: never a password); while it lasts, a reminder every
    ``remind_every`` seconds; once any call succeeds, one INFO line "reconnected to ...
    after N s". The individual failures are logged at DEBUG.
    """

    def __init__(
        self,
        broker: str,
        *,
        remind_every: float = REMIND_EVERY,
        confirm_after: float = CONFIRM_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.broker = broker
        self.remind_every = remind_every
        self.confirm_after = confirm_after
        self.clock = clock
        self.down_since: float | None = None
        self.outages = 0  # outages announced so far
        self._said_at: float | None = None  # last warning of this outage (None: none yet)
        self._failures = 0

    @property
    def down(self) -> bool:
        """True while the broker is believed unreachable."""
        return self.down_since is not None

    def failed(self, what: str, exc: BaseException) -> None:
        """A broker call of ``what`` (e.g. ``"fetch"``) failed with a transient error."""
        now = self.clock()
        log.debug("%s failed (%r)", what, exc)
        if self.down_since is None:
            self.down_since = now
            self._failures = 0
        self._failures += 1
        if self._said_at is None:
            if now - self.down_since < self.confirm_after:
                return
            self._said_at = now
            self.outages += 1
            log.warning(
                "cannot reach the broker %s for %.1fs (%s: %s); the worker keeps retrying "
                "and says so again every %.0fs",
                self.broker,
                now - self.down_since,
                what,
                printable(_reason(exc)),
                self.remind_every,
            )
        elif now - self._said_at >= self.remind_every:
            self._said_at = now
            log.warning(
                "the broker %s is still unreachable after %.0fs (%d failed calls; last: %s)",
                self.broker,
                now - self.down_since,
                self._failures,
                printable(_reason(exc)),
            )

    def ok(self) -> None:
        """A broker call succeeded: the broker answers."""
        if self.down_since is None:
            return
        now = self.clock()
        if self._said_at is not None:
            log.info("reconnected to the broker %s after %.1fs", self.broker, now - self.down_since)
        self.down_since = None
        self._said_at = None


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
