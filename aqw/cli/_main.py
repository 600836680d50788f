"""The ``aqw`` command line: ``worker``, ``enqueue``, ``status``, ``monitor``, ``dlq`` and
``bench``.

Settings come from arguments first, then ``AQW_*`` environment variables (``AQW_APP``,
``AQW_BROKER``, ``AQW_QUEUE``, ``AQW_CONCURRENCY``, ``AQW_PREFETCH``, ``AQW_GRACE``,
``AQW_PROCESSES``, ``AQW_LOG_LEVEL``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from pydantic import ValidationError
from redis.exceptions import RedisError

from .. import status as status_cli
from .._damage import damage_of
from .._text import printable
from ..app import App
from ..dlq import DeadLetters, dead_job_json
from ..errors import AqwError, ConfigError
from ..telemetry import configure_otel, shutdown_otel
from . import _monitor as monitor_cli
from .bench import _main as bench_cli

log = logging.getLogger("aqw.cli")


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


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise CliError(f"{name}={raw!r} is not an integer") from None


def _env_float(name: str, default: float) -> float:
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


# -- commands ------------------------------------------------------------------------------


async def cmd_worker(args: argparse.Namespace) -> int:
    app = resolve_app(args)
    if configure_otel("aqw-worker"):
        log.info("OpenTelemetry SDK configured from OTEL_* environment variables")
    concurrency = args.concurrency or _env_int("AQW_CONCURRENCY", 100)
    prefetch = args.prefetch if args.prefetch is not None else _env_int("AQW_PREFETCH", 0)
    grace = args.grace if args.grace is not None else _env_float("AQW_GRACE", 30.0)
    worker = app.worker(
        concurrency=concurrency,
        prefetch=prefetch,
        grace=grace,
        burst=args.burst,
        handle_signals=True,
    )
    started = time.perf_counter()
    try:
        await worker.run()
    finally:
        await app.close()
        shutdown_otel()
    elapsed = time.perf_counter() - started
    s = worker.stats
    print(
        f"aqw worker: {s.processed} processed, {s.retried} retried, {s.dead} dead-lettered, "
        f"{s.failed} failed runs in {elapsed:.1f}s",
        file=sys.stderr,
    )
    return 0


async def cmd_enqueue(args: argparse.Namespace) -> int:
    app = resolve_app(args)
    try:
        payload = json.loads(args.payload) if args.payload is not None else None
    except json.JSONDecodeError as exc:
        raise CliError(f"payload is not valid JSON: {exc}") from None
    task = app.get_task(args.task)
    try:
        job_id = await task.enqueue(payload, key=args.key, delay=args.delay)
    except ValidationError as exc:
        raise CliError(f"payload does not fit task {args.task!r}: {exc}") from None
    finally:
        await app.close()
    print(job_id)
    return 0


async def cmd_dlq(args: argparse.Namespace) -> int:
    app = resolve_app(args, need_app=False)
    dlq = app.dlq
    try:
        if args.dlq_command == "list":
            items = await dlq.list(task=args.task, error_type=args.error_type, limit=args.limit)
            if args.json:
                # ensure_ascii: control characters (ESC...) are written as \uXXXX escapes
                print(json.dumps([d.as_dict() for d in items], indent=2, ensure_ascii=True))
                return 0
            if not items:
                filtered = args.task is not None or args.error_type is not None
                print("no dead job matches" if filtered else "the dead-letter queue is empty")
                return 0
            print(f"{'ID':<20} {'TASK':<24} {'ERROR':<20} {'ATT':>3} {'FAILED AT':<19}  MESSAGE")
            for d in items:
                # Everything here came from the broker: escaped, so no terminal escape passes.
                when = _when(d.last_failed_at)
                message = printable(d.error.replace("\n", " "))[:60]
                task = printable(d.task) if d.task else "(undecodable)"
                print(f"{printable(d.id):<20} {task:<24.24} {printable(d.error_type):<20.20} "
                      f"{d.attempts:>3} {when}  {message}")  # fmt: skip
                for note in damage_of(d):
                    print(f"{'':<20} ! damaged entry: {printable(note)}")
            return 0
        if args.dlq_command == "show":
            dead = await dlq.get(args.id)
            if dead is None:
                raise CliError(f"no dead job with id {args.id!r}")
            print(dead_job_json(dead))
            return 0
        if args.dlq_command == "replay":
            if not (args.ids or args.all or args.task):
                raise CliError("replay: give entry IDs, --all or --task TASK")
            try:
                edit = json.loads(args.edit_payload) if args.edit_payload else None
            except json.JSONDecodeError as exc:
                raise CliError(f"--edit-payload is not valid JSON: {exc}") from None
            if edit is not None and not app.tasks:
                raise CliError("--edit-payload needs the app (--app MODULE:APP) to validate it")
            await _require_ids(dlq, args.ids)
            try:
                n = await dlq.replay(
                    args.ids, all=args.all, task=args.task, edit_payload=edit, progress=_progress
                )
            except ValidationError as exc:
                raise CliError(f"--edit-payload does not fit the task: {exc}") from None
            print(f"\nreplayed {n} jobs", file=sys.stderr)
            print(n)
            return 0
        if args.dlq_command == "purge":
            if args.older_than is None and not args.ids and not args.task and not args.all:
                raise CliError("purge: give entry IDs, --older-than SECONDS, --task or --all")
            older = 0.0 if args.all and args.older_than is None else args.older_than
            await _require_ids(dlq, args.ids)
            n = await dlq.purge(older_than=older, ids=args.ids, task=args.task)
            print(n)
            return 0
    finally:
        await app.close()
    raise CliError(f"unknown dlq command {args.dlq_command!r}")


def _when(at: float) -> str:
    """A failure time as local date and time (``?`` when unknown or not a plausible time)."""
    if at <= 0:
        return f"{'?':<19}"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    except (OverflowError, OSError, ValueError):
        return f"{'?':<19}"


async def _require_ids(dlq: DeadLetters, ids: Sequence[str]) -> None:
    missing = [i for i in ids if await dlq.get(i) is None]
    if missing:
        raise CliError(f"no dead job with id {', '.join(repr(i) for i in missing)}")


def _progress(done: int, total: int) -> None:
    width = 30
    filled = int(width * done / total) if total else width
    bar = "#" * filled + "-" * (width - filled)
    print(f"\r[{bar}] {done}/{total}", end="", file=sys.stderr, flush=True)


# -- parser --------------------------------------------------------------------------------


def _add_target(p: argparse.ArgumentParser, *, positional_app: bool) -> None:
    if positional_app:
        p.add_argument("app", nargs="?", help="the app, as package.module:app (or AQW_APP)")
    else:
        p.add_argument("--app", help="the app, as package.module:app (or AQW_APP)")
    p.add_argument("--broker", help="broker URL, overriding the app's (or AQW_BROKER)")
    p.add_argument("--queue", help="queue name, overriding the app's (or AQW_QUEUE)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aqw", description="asyncio job queue worker")
    parser.add_argument("--log-level", default=os.environ.get("AQW_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command", required=True)

    w = sub.add_parser("worker", help="run a worker")
    _add_target(w, positional_app=True)
    w.add_argument("-c", "--concurrency", type=int, help="most jobs at once (default 100)")
    w.add_argument("--prefetch", type=int, help="jobs fetched ahead of free slots (default 0)")
    w.add_argument("--grace", type=float, help="seconds to finish jobs on shutdown (default 30)")
    w.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    w.add_argument(
        "-p", "--processes", type=int,
        help="supervised worker processes, one event loop each (default 1, or AQW_PROCESSES)",
    )  # fmt: skip

    e = sub.add_parser("enqueue", help="enqueue one job")
    _add_target(e, positional_app=True)
    e.add_argument("task", help="task name")
    e.add_argument("payload", nargs="?", help="payload as JSON")
    e.add_argument("--key", help="idempotency key")
    e.add_argument("--delay", type=float, help="seconds before the job may run")

    status_cli.add_parser(sub)
    monitor_cli.add_parser(sub)
    bench_cli.add_parser(sub)

    d = sub.add_parser("dlq", help="dead-letter queue: list, show, replay, purge")
    dsub = d.add_subparsers(dest="dlq_command", required=True)
    dl = dsub.add_parser("list", help="list dead jobs")
    _add_target(dl, positional_app=False)
    dl.add_argument("--task")
    dl.add_argument("--error-type")
    dl.add_argument("--limit", type=int, default=100)
    dl.add_argument("--json", action="store_true")
    ds = dsub.add_parser("show", help="show one dead job")
    _add_target(ds, positional_app=False)
    ds.add_argument("id")
    dr = dsub.add_parser("replay", help="put dead jobs back on the queue")
    _add_target(dr, positional_app=False)
    dr.add_argument("ids", nargs="*")
    dr.add_argument("--all", action="store_true")
    dr.add_argument("--task")
    dr.add_argument("--edit-payload", help="replace the payload with this JSON")
    dp = dsub.add_parser("purge", help="delete dead jobs")
    _add_target(dp, positional_app=False)
    dp.add_argument("ids", nargs="*")
    dp.add_argument("--older-than", type=float, help="only jobs that failed this many seconds ago")
    dp.add_argument("--task")
    dp.add_argument("--all", action="store_true")
    return parser


COMMANDS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "worker": cmd_worker,
    "enqueue": cmd_enqueue,
    "status": status_cli.run,
    "monitor": monitor_cli.run,
    "dlq": cmd_dlq,
    "bench": bench_cli.run,
}


def _processes(args: argparse.Namespace) -> int:
    """Worker processes from ``--processes`` or ``AQW_PROCESSES`` (default 1)."""
    processes: int | None = args.processes
    if processes is None:
        processes = _env_int("AQW_PROCESSES", 1)
    if processes < 1:
        raise CliError(f"--processes must be >= 1, got {processes}")
    return processes


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``aqw`` command."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        if args.command == "worker" and _processes(args) > 1:
            # Outside asyncio.run: the supervisor owns the signals of its children.
            from .supervisor import run_supervised, worker_argv

            return run_supervised(worker_argv(args), _processes(args))
        return asyncio.run(COMMANDS[args.command](args))
    except (CliError, ConfigError) as exc:
        print(f"aqw: error: {printable(exc)}", file=sys.stderr)
        return 2
    except AqwError as exc:
        print(f"aqw: error: {printable(exc)}", file=sys.stderr)
        return 1
    except (ConnectionError, OSError, RedisError) as exc:
        print(f"aqw: error: cannot reach the broker: {printable(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
