"""Watching a queue: the ``Monitor`` that evaluates the alert rules (depth over baseline,
retry rate, stuck jobs) under a lease, and the sinks alerts go to."""

from ._monitor import MONITOR_KIND, Monitor, is_monitor_heartbeat
from ._rules import format_age
from ._sinks import Alert, CallbackSink, LogSink, Sink, WebhookSink

__all__ = [
    "MONITOR_KIND",
    "Alert",
    "CallbackSink",
    "LogSink",
    "Monitor",
    "Sink",
    "WebhookSink",
    "format_age",
    "is_monitor_heartbeat",
]
