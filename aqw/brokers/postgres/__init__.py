"""The PostgreSQL broker: ``postgresql://user@host/db?queue=emails&schema=aqw``
(``docs/brokers/postgresql.md``). Needs the ``postgres`` extra (asyncpg)."""

from __future__ import annotations

from ._broker import PostgresBroker, from_url
from ._sql import migration_sql

__all__ = ["PostgresBroker", "from_url", "migration_sql"]
