"""``aqw outbox status|relay`` and ``aqw db migrate|sql``: the app's outbox from the shell.

- ``aqw outbox status APP [--max-age S] [--json]``: rows not relayed yet and the age of the
  oldest; with ``--max-age``, exit 1 when the oldest is older (a check for cron or a probe).
- ``aqw outbox relay APP``: run the relay alone (workers run one too; one leads).
- ``aqw db migrate APP``: create or bring up to date the tables of the app's outbox and of
  its PostgreSQL broker (versioned).
- ``aqw db sql [APP] [--schema S] [--broker-tables]``: print the migrations, for teams that
  run their own (the outbox's; with ``--broker-tables``, the PostgreSQL broker's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from ..app import App
from ..outbox import Outbox, Relay
from ._common import (
    CliError,
    StopSignals,
    add_log_options,
    add_target,
    number,
    resolve_app,
)


def add_parser(sub: Any) -> None:
    """Add ``aqw outbox`` and ``aqw db`` to the command line's subparsers."""
    o = sub.add_parser("outbox", help="the transactional outbox: its backlog, its relay")
    add_log_options(o)
    osub = o.add_subparsers(dest="outbox_command", required=True)
    st = osub.add_parser("status", help="rows not relayed yet, and the oldest one's age")
    add_target(st, positional_app=True)
    st.add_argument(
        "--max-age",
        type=number(0.0),
        metavar="SECONDS",
        help="exit 1 when the oldest row waits longer than this",
    )
    st.add_argument("--json", action="store_true", help="print JSON for scripts")
    add_log_options(st)
    rl = osub.add_parser("relay", help="run the outbox relay until SIGINT/SIGTERM")
    add_target(rl, positional_app=True)
    add_log_options(rl)

    d = sub.add_parser("db", help="the PostgreSQL tables of aqw: migrate, print the SQL")
    add_log_options(d)
    dsub = d.add_subparsers(dest="db_command", required=True)
    mg = dsub.add_parser("migrate", help="create or update the tables (idempotent, versioned)")
    add_target(mg, positional_app=True)
    add_log_options(mg)
    sq = dsub.add_parser("sql", help="print the migrations' SQL")
    add_target(sq, positional_app=True)
    sq.add_argument("--schema", help="the schema to write them for (default: the app's)")
    sq.add_argument(
        "--broker-tables", action="store_true", help="the PostgreSQL broker's tables instead"
    )
    add_log_options(sq)


def _outbox(app: App) -> Outbox:
    if app.outbox is None:
        raise CliError("the app has no outbox: aqw.App(broker, outbox='postgresql://...')")
    return app.outbox


async def run_outbox(args: argparse.Namespace) -> int:
    """``aqw outbox status`` and ``aqw outbox relay``."""
    app = resolve_app(args)
    outbox = _outbox(app)
    try:
        if args.outbox_command == "status":
            status = await outbox.status()
            late = args.max_age is not None and status.oldest_age > args.max_age
            if args.json:
                print(json.dumps({"pending": status.pending, "oldest_age": status.oldest_age}))
            else:
                print(f"{status.pending} rows not relayed, oldest {status.oldest_age:.1f}s")
            return 1 if late else 0
        stop = asyncio.Event()
        relay = Relay(outbox, app, stop, "cli")
        await app.broker.connect()
        with StopSignals(stop.set) as signals:
            await relay.run()
        print(f"relayed {relay.relayed} rows")
        return signals.status
    finally:
        await app.close()


async def run_db(args: argparse.Namespace) -> int:
    """``aqw db migrate`` and ``aqw db sql``."""
    if args.db_command == "sql":
        app = resolve_app(args, need_app=False) if (args.app or args.app_word) else None
        if args.broker_tables:
            from ..brokers.postgres import migration_sql

            print(migration_sql(args.schema or "aqw"), end="")
            return 0
        url = app.outbox.dsn if app is not None and app.outbox is not None else "postgresql://"
        schema = args.schema or (app.outbox.schema if app and app.outbox else "public")
        print(Outbox(url, schema=schema).sql(), end="")
        return 0
    app = resolve_app(args)
    pg_broker = app.broker.system == "postgresql"
    if app.outbox is None and not pg_broker:
        raise CliError("the app has no PostgreSQL tables: no outbox and not a postgresql:// broker")
    try:
        if pg_broker:
            await app.broker.connect()  # migrates the broker's tables
            print("the broker's tables are up to date")
        if app.outbox is not None:
            applied = await app.outbox.migrate()
            print(f"outbox: applied migrations {applied}" if applied else "outbox: up to date")
    finally:
        await app.close()
    return 0
