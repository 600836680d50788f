"""``aqw dashboard``: serve the web dashboard of an app's queue under uvicorn, on loopback
unless told otherwise (``--host``). Needs the ``dashboard`` extra."""

from __future__ import annotations

import argparse
import signal
from typing import Any

from ..errors import extra_hint
from ._common import EXIT_INTERRUPTED, CliError, add_log_options, add_target, integer, resolve_app


def add_parser(sub: Any) -> None:
    """Add ``aqw dashboard`` to the command line's subparsers."""
    p = sub.add_parser(
        "dashboard",
        help="serve the web dashboard of a queue",
        description="Serve the web dashboard (aqw.dashboard.create_app) under uvicorn. It "
        "binds to 127.0.0.1 unless --host says otherwise: put it behind your own auth "
        "before exposing it (see the dashboard page of the docs).",
    )
    add_target(p, positional_app=True)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=integer(1), default=8080, help="port to listen on (default 8080)")
    p.add_argument(
        "--read-only",
        action="store_true",
        help="refuse every write action (cancel, replay, purge: whatever changes the queue)",
    )
    p.add_argument(
        "--trace-url",
        metavar="TEMPLATE",
        help="link trace ids, e.g. https://tempo.example/trace/{trace_id}",
    )
    add_log_options(p)


async def run(args: argparse.Namespace) -> int:
    """``aqw dashboard [APP] [--host H] [--port P] [--read-only]``: serve until SIGINT/SIGTERM."""
    if args.port > 65535:
        raise CliError(f"--port must be 1-65535, got {args.port}")
    try:
        import uvicorn

        from ..dashboard import create_app
    except ImportError as exc:
        raise CliError(
            f"aqw dashboard needs the dashboard extra (no module named {exc.name!r}): "
            f"{extra_hint('dashboard')}"
        ) from None
    app = resolve_app(args)
    try:
        web = create_app(app, read_only=args.read_only, trace_url=args.trace_url)
        config = uvicorn.Config(web, host=args.host, port=args.port, log_level="info")
        server = uvicorn.Server(config)
        await server.serve()
    finally:
        await app.close()
    # uvicorn handles SIGINT and SIGTERM itself; after Ctrl-C exit 130, as every command.
    interrupted = signal.SIGINT in getattr(server, "_captured_signals", ())
    return EXIT_INTERRUPTED if interrupted else 0
