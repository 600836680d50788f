"""What every ``aqw`` subcommand shares: the user error, finding the app (``MODULE:APP``,
``--broker``, ``--queue`` and their ``AQW_*`` variables), the ``AQW_*`` number readers and
the log setup."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from ..app import App

#: The log line of ``aqw`` commands.
LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


def load_app(spec: str) -> App:
    """Import ``package.module:attribute`` and return the App it names."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"app {spec!r} must look like 'package.module:app'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise CliError(f"cannot import module {module_name!r} (from {spec!r})") from None
        raise
    try:
        app = getattr(module, attr)
    except AttributeError:
        raise CliError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(app, App):
        raise CliError(f"{spec!r} is a {type(app).__name__}, not an aqw.App")
    return app


def env_int(name: str, default: int) -> int:
    """The integer in environment variable ``name`` (``default`` when unset or empty)."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise CliError(f"{name}={raw!r} is not an integer") from None


def env_float(name: str, default: float) -> float:
    """The number in environment variable ``name`` (``default`` when unset or empty)."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise CliError(f"{name}={raw!r} is not a number") from None


def resolve_app(args: argparse.Namespace, *, need_app: bool = True) -> App:
    """The app from ``--app``/``AQW_APP`` (or a bare one from ``--broker``), with the
    broker and queue overridden by ``--broker``/``AQW_BROKER`` and ``--queue``/``AQW_QUEUE``."""
    spec = getattr(args, "app", None) or os.environ.get("AQW_APP")
    broker_url = getattr(args, "broker", None) or os.environ.get("AQW_BROKER")
    queue = getattr(args, "queue", None) or os.environ.get("AQW_QUEUE")
    if spec:
        app = load_app(spec)
    elif need_app:
        raise CliError("name the app: MODULE:APP argument, --app, or AQW_APP")
    elif broker_url:
        return App(broker_url, queue=queue or "default")
    else:
        raise CliError("name an app (--app MODULE:APP) or a broker (--broker URL)")
    if broker_url or queue:
        app.use_broker(broker_url or app.broker_url or "memory://", queue or app.queue)
    return app


def add_target(p: argparse.ArgumentParser, *, positional_app: bool) -> None:
    """Add the app (``MODULE:APP`` or ``--app``), ``--broker`` and ``--queue`` to ``p``."""
    if positional_app:
        p.add_argument("app", nargs="?", help="the app, as package.module:app (or AQW_APP)")
    else:
        p.add_argument("--app", help="the app, as package.module:app (or AQW_APP)")
    p.add_argument("--broker", help="broker URL, overriding the app's (or AQW_BROKER)")
    p.add_argument("--queue", help="queue name, overriding the app's (or AQW_QUEUE)")


def add_log_level(parser: argparse.ArgumentParser, default: str) -> None:
    """Add ``--log-level`` (default ``AQW_LOG_LEVEL``, else ``default``) to ``parser``."""
    parser.add_argument("--log-level", default=os.environ.get("AQW_LOG_LEVEL", default))


def setup_logging(level: str, fmt: str = LOG_FORMAT) -> None:
    """Log records of ``level`` and above to stderr, as ``fmt``."""
    logging.basicConfig(level=level.upper(), format=fmt, stream=sys.stderr)
