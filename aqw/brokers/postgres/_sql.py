"""The broker's SQL: ``sql/<name>.sql`` for one schema, and its versioned migrations
(``sql/NNNN_*.sql``), applied by ``migrate`` (at ``connect``, under an advisory lock) and
recorded in ``<schema>.aqw_migrations`` as component ``broker``."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Any

from ...errors import ConfigError

COMPONENT = "broker"
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_MIGRATION = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def check_schema(schema: str) -> str:
    if not _IDENT.match(schema):
        raise ConfigError(
            f"postgresql:// schema must be letters, digits and underscores (at most 63, not "
            f"starting with a digit), got {schema!r}"
        )
    return schema


@cache
def _source(name: str) -> str:
    return resources.files("aqw.brokers.postgres").joinpath("sql", name).read_text("utf-8")


@cache
def statement(name: str, schema: str) -> str:
    """The statement of ``sql/<name>.sql`` for ``schema``."""
    return _source(f"{name}.sql").replace("{schema}", f'"{schema}"')


@cache
def migrations() -> tuple[tuple[int, str], ...]:
    folder = resources.files("aqw.brokers.postgres").joinpath("sql")
    found = [(int(m.group(1)), e.name) for e in folder.iterdir() if (m := _MIGRATION.match(e.name))]
    return tuple(sorted(found))


def _bootstrap(schema: str) -> list[str]:
    return [
        f'CREATE SCHEMA IF NOT EXISTS "{schema}";',
        f'CREATE TABLE IF NOT EXISTS "{schema}".aqw_migrations (component text NOT NULL, '
        "version integer NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(), "
        "PRIMARY KEY (component, version));",
    ]


def migration_sql(schema: str) -> str:
    """Every migration as one script with its bookkeeping rows (for teams that run their own)."""
    parts = _bootstrap(schema)
    for version, name in migrations():
        parts.append(f"-- {name}\n" + statement(name.removesuffix(".sql"), schema))
        parts.append(
            f'INSERT INTO "{schema}".aqw_migrations (component, version) '
            f"VALUES ('{COMPONENT}', {version});"
        )
    return "\n".join(parts) + "\n"


async def migrate(conn: Any, schema: str) -> list[int]:
    """Apply the migrations ``schema`` lacks, in one transaction under an advisory lock."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"aqw-migrate:{schema}")
        for line in _bootstrap(schema):
            await conn.execute(line)
        rows = await conn.fetch(
            f'SELECT version FROM "{schema}".aqw_migrations WHERE component = $1', COMPONENT
        )
        done = {r["version"] for r in rows}
        applied = []
        for version, name in migrations():
            if version not in done:
                await conn.execute(statement(name.removesuffix(".sql"), schema))
                await conn.execute(
                    f'INSERT INTO "{schema}".aqw_migrations (component, version) VALUES ($1, $2)',
                    COMPONENT,
                    version,
                )
                applied.append(version)
        return applied
