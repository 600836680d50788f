"""Priority levels, whatever the broker: the order in which a fetch reads a queue's levels
(the highest first, and a share of fetches that start from the lowest waiting level so
that nothing starves), and the in-memory broker's waiting jobs, one FIFO per level.

Levels are ``aqw.job.MIN_PRIORITY`` (0, the default) to ``MAX_PRIORITY`` (9); higher runs
first. The Redis side (one stream per level) is ``redis/_priorities.py``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from ...job import Job


class ShareCredit:
    """The turns of a fetch's priority share (``Broker.fetch(..., share=...)``): about that
    fraction of the fetches that find several levels waiting start from the lowest waiting
    level. Counted without randomness, so that the share holds over a short run too; a
    broker asks ``turn`` only for a fetch that finds several levels waiting."""

    __slots__ = ("_credit",)

    def __init__(self) -> None:
        self._credit = 0.0

    def turn(self, share: float) -> bool:
        """True for this fetch's turn to start from the lowest level: every 1/share-th."""
        if share <= 0:
            return False
        self._credit += share
        if self._credit >= 1.0:
            self._credit -= 1.0
            return True
        return False


def level_of(data: bytes) -> int:
    """The priority level of an encoded job (0 for one without, or that does not decode)."""
    if b'"priority"' not in data:
        return 0
    try:
        return Job.decode(data).priority
    except Exception:
        return 0


class LevelFifos:
    """The waiting entries of an in-memory queue: one FIFO (entry id -> data) per level.
    ``fifos[0]`` is the default level's; ``fifos[id] = data`` files an entry under the
    level of its envelope (``add``: under a given level)."""

    def __init__(self) -> None:
        self.fifos: dict[int, OrderedDict[str, bytes]] = {0: OrderedDict()}
        #: The levels with a FIFO, highest first.
        self._order: list[int] = [0]

    def add(self, entry_id: str, data: bytes, level: int = 0) -> None:
        fifo = self.fifos.get(level)
        if fifo is None:
            fifo = self.fifos[level] = OrderedDict()
            self._order = sorted(self.fifos, reverse=True)
        fifo[entry_id] = data

    def __setitem__(self, entry_id: str, data: bytes) -> None:
        self.add(entry_id, data, level_of(data))

    def __len__(self) -> int:
        return sum(len(f) for f in self.fifos.values())

    @property
    def mixed(self) -> bool:
        """True when more than one level has entries waiting."""
        return sum(1 for f in self.fifos.values() if f) > 1

    def __bool__(self) -> bool:
        return any(self.fifos.values())

    def take(self, count: int, share: bool) -> Iterator[tuple[str, bytes, int]]:
        """Up to ``count`` (entry id, data, level), taken off the highest levels first; a
        share fetch takes from the lowest level with entries first, then from the top."""
        order = self._order
        if share and len(order) > 1:
            lowest = next((lv for lv in reversed(order) if self.fifos[lv]), None)
            if lowest is not None:
                order = [lowest, *(lv for lv in order if lv != lowest)]
        for level in order:
            fifo = self.fifos[level]
            while fifo and count > 0:
                entry_id, data = fifo.popitem(last=False)
                count -= 1
                yield entry_id, data, level
            if count <= 0:
                return
