"""What the broker's pool does to a connection given back: asyncpg's default runs
``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL`` at every release, one more
round trip after each of the broker's statements. The broker's own statements leave no
session state behind (no session advisory lock, cursor, LISTEN or SET: the listener is a
connection of its own), so a connection only they used goes back as it is (asyncpg still
rolls back a transaction left open). One lent to a handler (``ctx.transaction()``) is
marked ``lent()`` and gets the full reset when it comes back."""

from __future__ import annotations

from typing import Any

import asyncpg


class BrokerConnection(asyncpg.Connection):  # type: ignore[misc]
    """A pool connection that knows whether code other than the broker's used it."""

    __slots__ = ("_aqw_lent",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._aqw_lent = False

    def lent(self) -> None:
        """Mark it handed to code that may leave session state: reset it fully on release."""
        self._aqw_lent = True


async def reset(conn: Any) -> None:
    """The pool's ``reset``: the full session reset only for a connection ``lent()``."""
    if getattr(conn, "_aqw_lent", True):
        conn._aqw_lent = False
        query = conn.get_reset_query()
        if query:
            await conn.execute(query)
