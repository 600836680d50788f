"""The PostgreSQL broker: ``postgresql://user@host/db?queue=emails&schema=aqw``
(``docs/brokers/postgresql.md``). Needs the ``postgres`` extra (asyncpg)."""

from __future__ import annotations

from ._broker import PostgresBroker
from ._sql import migration_sql
from ._url import from_url

__all__ = ["PostgresBroker", "from_url", "migration_sql"]
