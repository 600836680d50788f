"""What every ``aqw`` subcommand shares: the user error and the parser that prints usage
errors as one line, finding the app (``MODULE:APP``, ``--app``, ``--broker``, ``--queue`` and
their ``AQW_*`` variables), the readers of numbers (options and ``AQW_*`` variables, an
explicit 0 being a value) and the log options and setup."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import math
import os
import re
import shlex
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar
from urllib.parse import urlsplit

from pydantic import ValidationError

from ..app import App
from ._logs import LOG_FORMATS, configure_logging

T = TypeVar("T")

#: The levels ``--log-level`` takes (the formats of ``--log-format`` are ``LOG_FORMATS``).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

#: What ``package.module:attribute`` looks like: how a positional word is told to be the app.
APP_SPEC = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


class CliError(Exception):
    """A user error: printed as one line (and its ``details``, indented, one per line),
    exit status 2."""

    def __init__(self, message: str, details: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.details = tuple(details)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr, exit status 2,
    pointing at the help of the subcommand they are about."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            # argparse reports an unknown option of a subcommand from the top-level parser
            # ("see aqw --help"): the help that lists the options is the subcommand's.
            chosen_parser(self, parsed).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed


def chosen_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
    """The deepest subcommand's parser that ``args`` chose (``aqw dlq show``), else
    ``parser``."""
    for action in parser._actions:
        choices = action.choices
        if isinstance(choices, dict) and action.dest != argparse.SUPPRESS:
            chosen = choices.get(getattr(args, action.dest, None))
            if isinstance(chosen, argparse.ArgumentParser):
                return chosen_parser(chosen, args)
    return parser


def integer(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def number(minimum: float = 0.0, *, above: bool = False) -> Callable[[str], float]:
    """An argparse ``type``: a finite number >= ``minimum`` (> with ``above``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < minimum or (above and value == minimum):
            raise argparse.ArgumentTypeError(
                f"must be {'>' if above else '>='} {minimum:g}, got {text}"
            )
        return value

    return parse


def load_app(spec: str) -> App:
    """Import ``package.module:attribute`` and return the App it names."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"app {spec!r} must look like 'package.module:app'")
    if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
        raise CliError(
            f"app {spec!r} names a file: name its module instead, as "
            f"{module_spec(module_name)}:{attr} (run aqw from the directory it is in)"
        )
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


def module_spec(path: str) -> str:
    """The module a file path names, as ``import`` spells it: ``./jobs.py`` -> ``jobs``,
    ``src/shop/jobs.py`` -> ``src.shop.jobs``."""
    parts = [p for p in re.split(r"[/\\]+", path.removesuffix(".py")) if p not in ("", ".")]
    return ".".join(parts) or path


def env_value(name: str, default: T, parse: Callable[[str], T]) -> T:
    """Environment variable ``name`` read by ``parse`` (an argparse ``type`` such as
    ``integer(1)``); ``default`` when unset or empty. A bad value is a ``CliError``."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return parse(raw)
    except argparse.ArgumentTypeError as exc:
        raise CliError(f"{name}={raw!r}: {exc}") from None


def env_int(name: str, default: int, minimum: int | None = None) -> int:
    """The integer in environment variable ``name`` (``default`` when unset or empty), at
    least ``minimum`` when given (0 is a value, not "unset")."""
    return env_value(name, default, integer(-sys.maxsize if minimum is None else minimum))


def env_float(name: str, default: float, minimum: float | None = None) -> float:
    """The number in environment variable ``name`` (``default`` when unset or empty), at
    least ``minimum`` when given."""
    return env_value(name, default, number(-math.inf if minimum is None else minimum))


def resolve_app(args: argparse.Namespace, *, need_app: bool = True) -> App:
    """The app from ``APP``/``--app``/``AQW_APP`` (or a bare one from ``--broker``), with the
    broker and queue overridden by ``--broker``/``AQW_BROKER`` and ``--queue``/``AQW_QUEUE``."""
    app_argument(args)
    spec = getattr(args, "app", None) or os.environ.get("AQW_APP")
    broker_url = getattr(args, "broker", None) or os.environ.get("AQW_BROKER")
    queue = getattr(args, "queue", None) or os.environ.get("AQW_QUEUE")
    if spec:
        app = load_app(spec)
    elif need_app:
        raise CliError("name the app (package.module:app): the APP argument, --app or AQW_APP")
    elif broker_url:
        return App(broker_url, queue=queue or "default")
    else:
        raise CliError(
            "name an app (APP argument, --app or AQW_APP) or a broker (--broker or AQW_BROKER)"
        )
    if broker_url or queue:
        app.use_broker(broker_url or app.broker_url or "memory://", queue or app.queue)
    return app


def validation_error(what: str, exc: ValidationError) -> CliError:
    """The error of a value that does not fit (``payload does not fit task 'add'``):
    pydantic's first line after ``what``, then its lines per field, without its links."""
    first, *rest = str(exc).splitlines()
    details = [line for line in rest if not line.strip().startswith("For further information")]
    return CliError(f"{what}: {first}", details)


def target_options(args: argparse.Namespace) -> str:
    """The options a pasted ``aqw`` command needs to reach the same queue as this one, for
    the copy-paste hints it prints (``aqw dlq show ID --app jobs:app``): ``--app``, and
    ``--queue`` and ``--broker`` when they were given (by option or ``AQW_*`` variable);
    a broker URL with a password is left out (set ``AQW_BROKER`` in the shell instead)."""
    spec = getattr(args, "app", None) or os.environ.get("AQW_APP")
    broker = getattr(args, "broker", None) or os.environ.get("AQW_BROKER")
    queue = getattr(args, "queue", None) or os.environ.get("AQW_QUEUE")
    words = [f"--app {shlex.quote(spec)}"] if spec else []
    if broker and not urlsplit(broker).password:
        words.append(f"--broker {shlex.quote(broker)}")
    if queue:
        words.append(f"--queue {shlex.quote(queue)}")
    return "".join(f" {w}" for w in words)


def looks_like_app(word: str) -> bool:
    """Whether ``word`` reads as ``package.module:attribute`` (and so names the app)."""
    return APP_SPEC.fullmatch(word) is not None


def take_app(
    args: argparse.Namespace, words: Sequence[str | None], *, first_is_app: bool = False
) -> list[str]:
    """The positional ``words`` (None: not given) after the app. The first word is the app
    when ``first_is_app`` or when it looks like ``package.module:attribute``; it then becomes
    ``args.app`` (named differently by ``--app`` too, it is a ``CliError``)."""
    rest = [w for w in words if w is not None]
    if rest and (first_is_app or looks_like_app(rest[0])):
        app = rest.pop(0)
        given = getattr(args, "app", None)
        if given and given != app:
            raise CliError(f"the app is named twice: {app!r} and --app {given!r}")
        args.app = app
    return rest


def app_argument(args: argparse.Namespace) -> None:
    """The ``APP`` positional of ``add_target(positional_app=True)``, when given, becomes
    ``args.app`` (where the supervisor and ``resolve_app`` read it)."""
    word = getattr(args, "app_word", None)
    if word is not None:
        take_app(args, [word], first_is_app=True)
        args.app_word = None


def add_target(p: argparse.ArgumentParser, *, positional_app: bool) -> None:
    """Add the app (``--app``, and with ``positional_app`` an optional ``APP`` positional that
    ``app_argument`` reads), ``--broker`` and ``--queue`` to ``p``. A command whose first
    positional may be the app or something else adds its own and reads it with ``take_app``."""
    if positional_app:
        p.add_argument(
            "app_word",
            nargs="?",
            metavar="APP",
            help="the app, as package.module:app (or --app, or AQW_APP)",
        )
    p.add_argument("--app", metavar="APP", help="the app, as package.module:app (or AQW_APP)")
    p.add_argument(
        "--broker", metavar="URL", help="broker URL, overriding the app's (or AQW_BROKER)"
    )
    p.add_argument("--queue", help="queue name, overriding the app's (or AQW_QUEUE)")


def add_log_options(parser: argparse.ArgumentParser, default_level: str | None = None) -> None:
    """Add ``--log-level`` and ``--log-format`` to ``parser``: the top-level parser (with
    the ``default_level`` shown in the help) or, without one, a subcommand's, where an option
    left out does not overwrite the one given before the subcommand. ``log_options`` reads
    them, falling back on ``AQW_LOG_LEVEL`` and ``AQW_LOG_FORMAT``."""
    unset = None if default_level is not None else argparse.SUPPRESS
    shown = f", else {default_level}" if default_level else ""
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        metavar="LEVEL",
        default=unset,
        help=f"log {', '.join(LOG_LEVELS[:-1])} or {LOG_LEVELS[-1]} and above "
        f"(default: AQW_LOG_LEVEL{shown})",
    )
    parser.add_argument(
        "--log-format",
        type=str.lower,
        choices=LOG_FORMATS,
        default=unset,
        help="log lines as text or as one JSON object each (default: AQW_LOG_FORMAT, else text)",
    )


def log_options(args: argparse.Namespace, default_level: str) -> tuple[str, str]:
    """The log level and format: the options, else ``AQW_LOG_LEVEL``/``AQW_LOG_FORMAT``,
    else ``default_level`` and ``text``; a bad variable is a ``CliError``. They are written
    back to ``args`` (the supervisor passes them on to its workers)."""
    level = getattr(args, "log_level", None)
    if level is None:
        level = (os.environ.get("AQW_LOG_LEVEL") or default_level).strip().upper()
        if level not in LOG_LEVELS:
            raise CliError(f"AQW_LOG_LEVEL={level!r} is not one of {', '.join(LOG_LEVELS)}")
    fmt = getattr(args, "log_format", None)
    if fmt is None:
        fmt = (os.environ.get("AQW_LOG_FORMAT") or "text").strip().lower()
        if fmt not in LOG_FORMATS:
            raise CliError(f"AQW_LOG_FORMAT={fmt!r} is not one of {', '.join(LOG_FORMATS)}")
    args.log_level, args.log_format = level, fmt
    return level, fmt


def setup_logging(level: str, *, fmt: str | None = None) -> None:
    """Log records of ``level`` and above to stderr, as ``fmt`` (``text`` or ``json``;
    default ``AQW_LOG_FORMAT``, else ``text``); an unknown format or level is a ``CliError``."""
    if fmt is None:
        fmt = (os.environ.get("AQW_LOG_FORMAT") or "text").strip().lower()
    try:
        configure_logging(level, fmt, background=True)  # lines written off the event loop
    except ValueError as exc:
        raise CliError(str(exc)) from None


#: The exit status of a command stopped by Ctrl-C (SIGINT), as a shell reports it.
EXIT_INTERRUPTED = 128 + signal.SIGINT


class StopSignals:
    """SIGINT and SIGTERM call ``on_stop`` (once each time) while in the ``with`` block, and
    ``status`` says how the command ends: ``EXIT_INTERRUPTED`` after Ctrl-C, else 0."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, on_stop: Callable[[], None]) -> None:
        self.on_stop = on_stop
        self.received: signal.Signals | None = None

    def __enter__(self) -> StopSignals:
        loop = asyncio.get_running_loop()
        for sig in self.SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._received, sig)
        return self

    def __exit__(self, *exc: object) -> None:
        loop = asyncio.get_running_loop()
        for sig in self.SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)

    def _received(self, sig: signal.Signals) -> None:
        self.received = self.received or sig
        self.on_stop()

    @property
    def status(self) -> int:
        return EXIT_INTERRUPTED if self.received == signal.SIGINT else 0


def error_line(message: str, lead: str = "aqw: error: ") -> None:
    """Write ``aqw: error: message`` (or ``lead`` and the message) to stderr in one write:
    the workers of ``--processes`` share their supervisor's stderr, and ``print``'s text and
    newline, written apart, can interleave with another process's line."""
    sys.stderr.write(f"{lead}{message}\n")
    sys.stderr.flush()
