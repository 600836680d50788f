"""The trace context jobs' headers carry, read once per run of jobs with the same headers."""

from __future__ import annotations

from opentelemetry import propagate
from opentelemetry.context import Context

#: The empty context: a job's context is read onto it, never onto the worker's current one.
ROOT = Context()


class HeaderContexts:
    """The trace context in jobs' headers, read with the global propagator onto the root
    context (not the current one: a job's context is what its headers carry, whatever is
    current in the worker). The jobs of one ``enqueue_many`` carry the same headers, and
    usually arrive together: the last headers read and their context are kept, so a run of
    such jobs is read once (a ``Context`` is immutable, safe to share)."""

    __slots__ = ("context", "headers")

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.context = ROOT

    def of(self, headers: dict[str, str]) -> Context:
        """The context ``headers`` carry (the root context when they are empty)."""
        if not headers:
            return ROOT
        if headers != self.headers:
            # a copy: a caller may change its own dict later
            self.context = propagate.extract(headers, ROOT)
            self.headers = dict(headers)
        return self.context
