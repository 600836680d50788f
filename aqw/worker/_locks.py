"""Resource locks taken by handlers through ``ctx.lock(name)``."""

from __future__ import annotations

from typing import Any

from ..errors import LeaseUnavailable
from ..lease import Lease
from ..telemetry import Telemetry


class ResourceLock(Lease):
    """A handler's resource lease that reports contention (refused or waited acquisitions,
    and the time waited) to telemetry."""

    def __init__(self, tel: Telemetry, name: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tel = tel
        self._name = name

    async def acquire(self) -> None:
        with self._tel.lock(self._name):
            try:
                await super().acquire()
            except LeaseUnavailable as exc:
                self._tel.count("aqw.lock.contended")
                self._tel.observe("aqw.lock.wait", exc.waited)
                raise
        if self.waited > 0:
            self._tel.count("aqw.lock.contended")
            self._tel.observe("aqw.lock.wait", self.waited)
