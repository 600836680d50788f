"""``app.limits``: rate limits and per-key caps changed at run time, stored with the queue
(the broker's ``run_limits`` part), honoured by every running worker within a second, no
restart (``aqw limits set|show|reset`` is the same on the command line)."""

from __future__ import annotations

from typing import Any, Protocol

from .._text import quoted
from ..brokers import Broker
from ..errors import ConfigError
from ..flow import parse_rate, stored_rate
from ..task import Task


class LimitsApp(Protocol):
    @property
    def broker(self) -> Broker: ...
    @property
    def tasks(self) -> dict[str, Task[Any]]: ...
    def get_task(self, name: str) -> Task[Any]: ...


class RunTimeLimits:
    """The run-time limits of an app's queue (``app.limits``).

    ``name`` is a task's name (its rate limit, for each of its rate keys, and its per-key
    cap) or ``"<task>:<rate key>"`` (the rate of that one key's bucket)."""

    def __init__(self, app: LimitsApp) -> None:
        self._app = app

    def _store(self) -> Any:
        store = self._app.broker.run_limits
        if store is None:
            raise ConfigError(
                f"limits: the {self._app.broker.system} broker keeps no limits with the queue, "
                "so they cannot change at run time"
            )
        return store

    def _task(self, name: str) -> tuple[Task[Any], str | None]:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"limits: the task must be a task's name, got {quoted(name)}")
        task_name, _, key = name.partition(":")
        return self._app.get_task(task_name), (key or None)

    async def set(
        self, name: str, rate: str | None = None, *, max_per_key: int | None = None
    ) -> None:
        """Set ``name``'s rate (``"20/s"``) and/or its tasks's ``max_per_key``, over the
        registered values, for every worker of the queue."""
        task, key = self._task(name)
        flow = task.options.flow
        if rate is None and max_per_key is None:
            raise ConfigError("limits set: give a rate ('20/s') or max_per_key")
        if rate is not None:
            parsed = parse_rate(rate, task.name)
            if flow.rate is None:
                raise ConfigError(
                    f"limits set: task {quoted(task.name)} has no rate_limit to change "
                    "(give it one at registration: @app.task(rate_limit=...))"
                )
            if key is not None and flow.rate_key is None:
                raise ConfigError(f"limits set: task {quoted(task.name)} has no rate_key")
        if max_per_key is not None:
            if key is not None:
                raise ConfigError("limits set: max_per_key is the task's, not one key's")
            if isinstance(max_per_key, bool) or not isinstance(max_per_key, int) or max_per_key < 1:
                raise ConfigError(
                    f"limits set: max_per_key must be an integer >= 1, got {quoted(max_per_key)}"
                )
            if flow.max_per_key is None:
                raise ConfigError(
                    f"limits set: task {quoted(task.name)} has no per-key cap to change "
                    "(give it one at registration: concurrency_key=..., max_per_key=...)"
                )
        store = self._store()
        if rate is not None:
            await store.write(f"rate:{name}", str(parsed))
        if max_per_key is not None:
            await store.write(f"cap:{task.name}", str(max_per_key))

    async def reset(self, name: str) -> None:
        """Back to the registered values for ``name`` (a task: its rate, its rate keys'
        rates and its cap)."""
        task, key = self._task(name)
        store = self._store()
        if key is not None:
            await store.write(f"rate:{name}", None)
            return
        for stored in await store.read():
            if stored in (f"rate:{task.name}", f"cap:{task.name}") or stored.startswith(
                f"rate:{task.name}:"
            ):
                await store.write(stored, None)

    async def show(self) -> list[dict[str, Any]]:
        """Each limit in force that differs from its registration, or is registered: one row
        per task with limits (``name``, ``registered``, ``now``, ``kind`` rate or cap)."""
        store = self._store()
        stored = await store.read()
        rows: list[dict[str, Any]] = []
        tasks = self._app.tasks
        for task_name in sorted(tasks):
            flow = tasks[task_name].options.flow
            if flow.rate is not None:
                now = stored_rate(stored.get(f"rate:{task_name}")) or flow.rate
                rows.append(_row(task_name, "rate", str(flow.rate), str(now)))
                prefix = f"rate:{task_name}:"
                for field in sorted(f for f in stored if f.startswith(prefix)):
                    now = stored_rate(stored[field]) or flow.rate
                    rows.append(_row(field[5:], "rate", str(flow.rate), str(now)))
            if flow.max_per_key is not None:
                cap = stored.get(f"cap:{task_name}")
                now_cap = cap if cap is not None and cap.isdigit() else str(flow.max_per_key)
                rows.append(_row(task_name, "max_per_key", str(flow.max_per_key), now_cap))
        return rows


def _row(name: str, kind: str, registered: str, now: str) -> dict[str, Any]:
    return {"name": name, "kind": kind, "registered": registered, "now": now}
