"""``aqw monitor``: run a ``Monitor`` on a queue until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
from typing import Any

from ..monitor import LogSink, Monitor, Sink, WebhookSink
from ..telemetry import configure_otel, shutdown_otel
from ._common import StopSignals, add_log_options, add_target, number, resolve_app


def add_parser(sub: Any) -> None:
    """Add ``aqw monitor`` to the command line's subparsers."""
    p = sub.add_parser("monitor", help="evaluate the alert rules of a queue until stopped")
    add_target(p, positional_app=True)
    p.add_argument(
        "--webhook",
        action="append",
        default=[],
        metavar="URL",
        help="POST alert transitions as JSON to URL (repeatable)",
    )
    p.add_argument(
        "--interval",
        type=number(0, above=True),
        default=15.0,
        metavar="SECONDS",
        help="seconds between evaluations, > 0 (default 15)",
    )
    p.add_argument(
        "--give-up-after",
        type=number(0, above=True),
        default=60.0,
        metavar="SECONDS",
        help="exit 1 when the broker has not answered for this long (default 60)",
    )
    add_log_options(p)


async def run(args: argparse.Namespace) -> int:
    """``aqw monitor``: run a ``Monitor`` until SIGTERM or SIGINT."""
    app = resolve_app(args, need_app=False)
    otel = configure_otel(service_name="aqw-monitor")
    sinks: list[Sink] = [LogSink(), *(WebhookSink(url) for url in args.webhook)]
    monitor = Monitor(app, sinks=sinks, interval=args.interval, give_up_after=args.give_up_after)
    try:
        # Until a signal stops it (Ctrl-C: exit status 130), or it gives up on an
        # unreachable broker (BrokerUnavailable: one line on stderr, exit 1).
        with StopSignals(monitor.stop) as signals:
            await monitor.run()
    finally:
        await app.close()
        if otel:
            shutdown_otel()
    return signals.status
