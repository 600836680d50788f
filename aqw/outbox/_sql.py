"""The outbox's SQL: the statements in ``sql/*.sql``, read once, for one schema; and the
versioned migrations in ``sql/migrations/NNNN_*.sql``, applied in order (``migrate``) or
printed for teams that run their own (``migration_sql``).

Every statement names its tables ``{schema}.aqw_*``: a caller's connection has its own
``search_path``, so nothing relies on it.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Any

from ..errors import ConfigError

#: The component name of the outbox's rows in ``aqw_migrations``.
COMPONENT = "outbox"
#: A schema name as the outbox takes it: quoted in every statement.
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_MIGRATION = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def check_schema(schema: object) -> str:
    """``schema`` when it is a plain SQL identifier, else a ConfigError naming ``schema``."""
    if not isinstance(schema, str) or not _IDENT.match(schema):
        raise ConfigError(
            f"outbox schema must be letters, digits and underscores (at most 63, not starting "
            f"with a digit), got {schema!r}"
        )
    return schema


@cache
def _source(name: str) -> str:
    return resources.files("aqw.outbox").joinpath("sql", name).read_text("utf-8")


@cache
def statement(name: str, schema: str) -> str:
    """The statement of ``sql/<name>.sql`` for ``schema``."""
    return _source(f"{name}.sql").replace("{schema}", f'"{schema}"')


@cache
def migrations() -> tuple[tuple[int, str], ...]:
    """(version, file name) of every migration, in order."""
    folder = resources.files("aqw.outbox").joinpath("sql", "migrations")
    found = []
    for entry in folder.iterdir():
        m = _MIGRATION.match(entry.name)
        if m:
            found.append((int(m.group(1)), entry.name))
    return tuple(sorted(found))


def _migration(name: str, schema: str) -> str:
    return _source(f"migrations/{name}").replace("{schema}", f'"{schema}"')


def migration_sql(schema: str) -> str:
    """Every migration as one script, each with its bookkeeping row, idempotent only as a
    whole through ``aqw_migrations`` (``aqw db sql``: for Alembic and friends)."""
    parts = [statement("migrations_table", schema)]
    for version, name in migrations():
        parts.append(f"-- {name}\n{_migration(name, schema)}")
        parts.append(
            f'INSERT INTO "{schema}".aqw_migrations (component, version) '
            f"VALUES ('{COMPONENT}', {version});\n"
        )
    return "\n".join(parts)


async def migrate(conn: Any, schema: str) -> list[int]:
    """Apply the migrations ``schema`` lacks, in order, in one transaction under an advisory
    lock (two processes migrating at once: the second waits, then finds nothing to do).
    Returns the versions applied. ``conn``: an asyncpg connection."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"aqw-migrate:{schema}")
        await conn.execute(statement("migrations_table", schema))
        rows = await conn.fetch(
            f'SELECT version FROM "{schema}".aqw_migrations WHERE component = $1', COMPONENT
        )
        done = {r["version"] for r in rows}
        applied = []
        for version, name in migrations():
            if version in done:
                continue
            await conn.execute(_migration(name, schema))
            await conn.execute(
                f'INSERT INTO "{schema}".aqw_migrations (component, version) VALUES ($1, $2)',
                COMPONENT,
                version,
            )
            applied.append(version)
        return applied


def pending_migrations_error(schema: str) -> ConfigError:
    """The one line for an outbox whose tables are not there."""
    return ConfigError(
        f'the outbox tables are missing in schema "{schema}": run aqw db migrate --app '
        "MODULE:APP (or apply aqw db sql), or start a worker, which migrates on start"
    )
