"""The ``queues=`` option of a worker (``QueuePlan``) and queue names as arguments."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..._redis.keys import validate_queue_name
from ...errors import ConfigError


def check_queue(name: object, what: str = "queue") -> str:
    """``name`` when it is a valid queue name, else a ConfigError naming ``what``."""
    if not isinstance(name, str):
        raise ConfigError(f"{what} must be a queue name (a string), got {name!r}")
    try:
        return validate_queue_name(name)
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None


@dataclass(frozen=True, slots=True)
class QueuePlan:
    """The queues a worker serves, in order, and their weights (None: strict order)."""

    names: tuple[str, ...]
    weights: tuple[float, ...] | None = None

    def describe(self) -> str:
        if self.weights is None:
            return ",".join(self.names)
        return ",".join(f"{n}={w:g}" for n, w in zip(self.names, self.weights, strict=True))


def queue_plan(queues: object) -> QueuePlan:
    """Check a ``queues=`` option: a list of queue names (strict order) or a mapping of name
    to weight > 0. An empty one, a duplicate name, a bad name or weight is a ConfigError
    naming ``queues``."""
    if isinstance(queues, str):
        raise ConfigError(
            f"queues must be a list of queue names or a mapping of name to weight, got {queues!r}"
            " (a string: pass a list, e.g. queues=['high', 'default'])"
        )
    weights: tuple[float, ...] | None = None
    if isinstance(queues, Mapping):
        names = list(queues)
        for name, weight in queues.items():
            bad = isinstance(weight, bool) or not isinstance(weight, int | float)
            if bad or not 0 < weight < 1e9:
                raise ConfigError(f"queues: the weight of {name!r} must be > 0, got {weight!r}")
        weights = tuple(float(w) for w in queues.values())
    elif isinstance(queues, Iterable):
        names = list(queues)
    else:
        raise ConfigError(
            f"queues must be a list of queue names or a mapping of name to weight, got {queues!r}"
        )
    if not names:
        raise ConfigError("queues: name at least one queue")
    for name in names:
        check_queue(name, "queues")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ConfigError(f"queues: {name!r} is named twice")
        seen.add(name)
    return QueuePlan(tuple(names), weights)
