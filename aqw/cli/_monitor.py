"""``aqw monitor``: run a ``Monitor`` on a queue until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from typing import Any

from ..monitor import LogSink, Monitor, Sink, WebhookSink
from ..telemetry import configure_otel, shutdown_otel
from ._common import add_target, resolve_app


def add_parser(sub: Any) -> None:
    """Add ``aqw monitor`` to the command line's subparsers."""
    p = sub.add_parser("monitor", help="evaluate the alert rules of a queue until stopped")
    add_target(p, positional_app=False)
    p.add_argument(
        "--webhook",
        action="append",
        default=[],
        metavar="URL",
        help="POST alert transitions as JSON to URL (repeatable)",
    )
    p.add_argument("--interval", type=float, default=15.0, help="seconds between evaluations")


async def run(args: argparse.Namespace) -> int:
    """``aqw monitor``: run a ``Monitor`` until SIGTERM or SIGINT."""
    app = resolve_app(args, need_app=False)
    otel = configure_otel(service_name="aqw-monitor")
    sinks: list[Sink] = [LogSink(), *(WebhookSink(url) for url in args.webhook)]
    monitor = Monitor(app, sinks=sinks, interval=args.interval)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        async with monitor:
            await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        await app.close()
        if otel:
            shutdown_otel()
    return 0
