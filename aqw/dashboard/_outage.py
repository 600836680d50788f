"""Whether the broker answers, as the dashboard's requests find it.

A page that cannot reach the broker shows the broker-down page (503) instead of a bare
error; the outage is logged once, when it starts, and once more when the broker answers
again: never once per request. Nothing else is needed to recover: the lazy connect runs
again on the next request until it succeeds, and a connected client reconnects by itself."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ._format import reason

log = logging.getLogger("aqw.dashboard")


class BrokerWatch:
    """The outage in progress, if any: since when, and its last reason."""

    def __init__(self, where: Callable[[], str], clock: Callable[[], float] = time.time) -> None:
        #: Where the broker is (``Broker.describe``: no secret in it).
        self.where = where
        self.clock = clock
        #: When the first failure of this outage was seen (None: no outage).
        self.down_since: float | None = None
        #: Why the last request failed (``Type: message``).
        self.reason = ""

    def failed(self, error: BaseException) -> None:
        """A request could not reach the broker: the first of an outage logs one WARNING."""
        self.reason = reason(error)
        if self.down_since is None:
            self.down_since = self.clock()
            log.warning(
                "dashboard: cannot reach the broker %s (%s); its pages answer 503 until it "
                "answers again",
                self.where(),
                self.reason,
            )

    def answered(self, started: float) -> None:
        """A request that started at ``started`` was served: one INFO ends an outage, unless
        the request began before the outage (a reply already on its way when it began)."""
        if self.down_since is None or started < self.down_since:
            return
        log.info(
            "dashboard: the broker %s answers again after %.1fs",
            self.where(),
            self.clock() - self.down_since,
        )
        self.down_since = None
        self.reason = ""
