"""``postgresql://user@host:5432/db?queue=emails&schema=aqw&pool=10``: the broker a URL
names, on the connection set of its database (one per URL in a process)."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ...errors import ConfigError
from ._broker import PostgresBroker
from ._connection import Connection
from ._sql import check_schema

#: Default connections of a process's pool to one database.
POOL_SIZE = 10
_CONNECTIONS: dict[tuple[str, str, int], Connection] = {}


def from_url(url: str, queue: str) -> PostgresBroker:
    """``postgresql://user@host:5432/db?queue=emails&schema=aqw&pool=10``."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    queue = query.pop("queue", queue)
    schema = check_schema(query.pop("schema", "aqw"))
    try:
        pool = int(query.pop("pool", POOL_SIZE))
    except ValueError:
        raise ConfigError(f"postgresql:// pool must be an integer, in {url!r}") from None
    dsn = urlunsplit(parts._replace(query=urlencode(query)))
    key = (dsn, schema, pool)
    conn = _CONNECTIONS.get(key)
    if conn is None or conn.pool is None:
        conn = _CONNECTIONS[key] = Connection(dsn, schema, pool)
    return PostgresBroker(conn, queue)
