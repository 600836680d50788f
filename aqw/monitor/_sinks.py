"""Alerts and where they go: an ``Alert`` fires and resolves; each transition goes to every
``Sink`` (``LogSink``, ``WebhookSink``, ``CallbackSink``, or any object with
``async emit(alert)``). ``aqw.monitor._monitor.Monitor`` raises them."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import logging
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import ConfigError

log = logging.getLogger("aqw.monitor")  # the monitor's logger: alerts are its output

__all__ = ["Alert", "CallbackSink", "LogSink", "Sink", "WebhookSink"]


@dataclass(slots=True)
class Alert:
    """One alert: fired at ``fired_at``, active until ``resolved_at`` is set.

    ``key`` tells alerts of one rule apart (``stuck_job:<job id>``); it is the rule name for
    the queue-wide rules."""

    rule: str
    queue: str
    severity: str
    summary: str
    details: dict[str, Any]
    fired_at: float
    resolved_at: float | None = None
    key: str = ""

    def __post_init__(self) -> None:
        self.key = self.key or self.rule

    @property
    def active(self) -> bool:
        """True until the alert resolves."""
        return self.resolved_at is None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able form."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Alert:
        """The inverse of ``as_dict``."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


class Sink(Protocol):
    """Where alert transitions go: ``emit`` is called when an alert fires and when it
    resolves (``alert.resolved_at`` set)."""

    async def emit(self, alert: Alert) -> None: ...


class LogSink(Sink):
    """Logs firing alerts at ``level`` (default WARNING) and resolutions at INFO."""

    def __init__(self, logger: logging.Logger | None = None, level: int = logging.WARNING) -> None:
        self.logger = logger or log
        self.level = level

    async def emit(self, alert: Alert) -> None:
        if alert.active:
            self.logger.log(
                self.level,
                "ALERT %s [%s] queue=%s: %s",
                alert.key,
                alert.severity,
                alert.queue,
                alert.summary,
            )
        else:
            self.logger.info("RESOLVED %s queue=%s: %s", alert.key, alert.queue, alert.summary)


class CallbackSink(Sink):
    """Calls ``fn(alert)``; ``fn`` may be a plain function or a coroutine function."""

    def __init__(self, fn: Callable[[Alert], Any]) -> None:
        self.fn = fn

    async def emit(self, alert: Alert) -> None:
        result = self.fn(alert)
        if inspect.isawaitable(result):
            await result


class WebhookSink(Sink):
    """POSTs ``{"status": "firing" | "resolved", "alert": {...}}`` as JSON to ``url``, with
    httpx when installed, else urllib in a thread. A failure is logged and counted in
    ``failures``; it never raises into the monitor."""

    def __init__(
        self, url: str, *, timeout: float = 5.0, headers: dict[str, str] | None = None
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"webhook URL must be http:// or https://, got {url!r}")
        self.url = url
        self.timeout = timeout
        self.headers = {"content-type": "application/json", **(headers or {})}
        self.sent = 0
        self.failures = 0

    async def emit(self, alert: Alert) -> None:
        body = json.dumps(
            {"status": "firing" if alert.active else "resolved", "alert": alert.as_dict()},
            default=str,
        ).encode()
        try:
            async with asyncio.timeout(self.timeout + 1.0):
                await self._post(body)
            self.sent += 1
        except Exception as exc:
            self.failures += 1
            log.warning("webhook %s failed for alert %s: %r", self.url, alert.key, exc)

    async def _post(self, body: bytes) -> None:
        try:
            import httpx
        except ImportError:  # pragma: no cover - httpx is a dev dependency
            await asyncio.to_thread(self._post_urllib, body)
            return
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            response = await client.post(self.url, content=body, headers=self.headers)
            response.raise_for_status()

    def _post_urllib(self, body: bytes) -> None:
        request = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            response.read()
