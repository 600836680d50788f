"""The base of every part: a small contract that says whether its state is shared."""

from __future__ import annotations

from typing import Protocol


class Part(Protocol):
    """What every part says about itself."""

    #: True: every process that opens the queue sees the same (a server holds it);
    #: False: kept in this process only.
    @property
    def shared(self) -> bool: ...
