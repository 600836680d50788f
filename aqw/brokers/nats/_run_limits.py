"""Limits changed at run time on NATS (``NatsBroker.run_limits``): one key, ``limits``, of the
queue's ``AQW_q_STATE`` bucket, holding the map (``aqw.brokers.parts.RunLimits`` says what it
maps) as JSON. A change reads it and writes it back with ``update(last=revision)``
(``create`` when there is none), read again when another process wrote first, so two changes
at once both hold. Each worker caches it (``OverrideCache``, read again every 0.5 s)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from ..local import StoredRunLimits

#: The key of the map in the state bucket.
KEY = "limits"

#: Most compare-and-set rounds of one change.
ROUNDS = 20


def _decode(raw: bytes | None) -> dict[str, str]:
    try:
        value = json.loads(raw or b"{}")
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items()}


class KvRunLimits(StoredRunLimits):
    """``RunLimits`` in the state bucket, shared by every process of the queue."""

    def __init__(self, state: Callable[[], Awaitable[KeyValue]]) -> None:
        self._state = state
        super().__init__()

    async def _get(self) -> tuple[dict[str, str], int | None]:
        kv = await self._state()
        try:
            entry = await kv.get(KEY)
        except KeyNotFoundError:
            return {}, None
        return _decode(entry.value), entry.revision

    async def read(self) -> dict[str, str]:
        return (await self._get())[0]

    async def write(self, name: str, value: str | None) -> None:
        kv = await self._state()
        for _ in range(ROUNDS):
            values, revision = await self._get()
            if value is None:
                if name not in values:
                    return
                values.pop(name)
            else:
                values[name] = value
            data = json.dumps(values, sort_keys=True).encode()
            try:
                if revision is None:
                    await kv.create(KEY, data)
                else:
                    await kv.update(KEY, data, last=revision)
            except KeyWrongLastSequenceError:
                continue  # another change landed first: apply this one to it
            return
        raise ConnectionError("the queue's run-time limits kept changing under this change")
