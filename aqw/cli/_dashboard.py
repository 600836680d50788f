"""``aqw dashboard``: serve the web dashboard of an app's queue under uvicorn, on loopback
unless told otherwise (``--host``). Needs the ``dashboard`` extra.

It starts as ``aqw worker`` does: it connects to the broker first and refuses to start
against one that does not answer (one line, exit status 1); then it binds its address
(one line naming ``--host``/``--port`` when it cannot, exit status 2) and says where it
listens and which queue it shows, before uvicorn serves."""

from __future__ import annotations

import argparse
import signal
import socket
import sys
from typing import Any

from .._redact import redact_error
from ..errors import BrokerUnavailable, extra_hint
from ._common import EXIT_INTERRUPTED, CliError, add_log_options, add_target, integer, resolve_app


def add_parser(sub: Any) -> None:
    """Add ``aqw dashboard`` to the command line's subparsers."""
    p = sub.add_parser(
        "dashboard",
        help="serve the web dashboard of a queue",
        description="Serve the web dashboard (aqw.dashboard.create_app) under uvicorn. It "
        "binds to 127.0.0.1 unless --host says otherwise: put it behind your own auth "
        "before exposing it (see the dashboard page of the docs). It refuses to start when "
        "the broker does not answer (exit status 1), and says where it listens.",
    )
    add_target(p, positional_app=True)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=integer(1), default=8080, help="port to listen on (default 8080)")
    p.add_argument(
        "--read-only",
        action="store_true",
        help="refuse every write action (cancel, replay, replay with an edited payload, "
        "pause, resume, delete a waiting job, run a delayed job now, purge) and show no "
        "button for them",
    )
    p.add_argument(
        "--trace-url",
        metavar="TEMPLATE",
        help="link trace ids, e.g. https://tempo.example/trace/{trace_id}",
    )
    add_log_options(p)


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (uvicorn listens on it), or a one-line error."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise CliError(f"--host {host!r}: cannot listen there: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise CliError(
            f"--host/--port: cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None
    return sock


def url_of(sock: socket.socket) -> str:
    """The ``http://`` address ``sock`` listens on (an IPv6 address in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


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
        broker = app.broker
        try:
            await broker.connect()
        except broker.transient_errors as exc:
            raise BrokerUnavailable(
                f"cannot reach the broker {broker.describe()}: {redact_error(exc)}"
            ) from None
        sock = listen(args.host, args.port)
        mode = " (read-only)" if args.read_only else ""
        sys.stderr.write(
            f"aqw dashboard: queue {app.queue!r} of {broker.describe()}, "
            f"listening on {url_of(sock)}{mode}\n"
        )
        sys.stderr.flush()
        config = uvicorn.Config(web, log_level="info")
        server = uvicorn.Server(config)
        with sock:
            await server.serve(sockets=[sock])
    finally:
        await app.close()
    # uvicorn handles SIGINT and SIGTERM itself; after Ctrl-C exit 130, as every command.
    interrupted = signal.SIGINT in getattr(server, "_captured_signals", ())
    return EXIT_INTERRUPTED if interrupted else 0
