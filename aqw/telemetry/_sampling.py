"""What a tracer's sampler decides whatever the trace id: read once from the SDK's own
samplers, so that a job whose ``process`` span would be dropped starts no span at all."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Drops:
    """Which ``process`` spans the sampler drops, known without asking it: ``roots`` (no
    parent: a job without trace context, or every job with ``trace_link``), ``unsampled``
    (a child of a remote parent that is not sampled) and ``sampled`` (a child of a sampled
    remote parent: only ``ALWAYS_OFF`` drops it). Each only when the spans the handler
    starts under such a span (local children of an unsampled span) are dropped too, so that
    skipping the span changes no decision."""

    roots: bool
    unsampled: bool
    sampled: bool


def _always_drops(sampler: Any) -> bool:
    try:
        from opentelemetry.sdk.trace.sampling import Decision, StaticSampler
    except ImportError:  # pragma: no cover - an SDK is what made the tracer
        return False
    return type(sampler) is StaticSampler and sampler._decision is Decision.DROP


def known_drops(tracer: Any) -> Drops | None:
    """The ``Drops`` of ``tracer``'s sampler when it is the SDK's ``ALWAYS_OFF`` or a
    ``ParentBased`` one (the SDK's default) whose parts say so; None for any other sampler
    (a ratio, a custom one): every job then asks it, through ``start_span``."""
    sampler = getattr(tracer, "sampler", None)
    if sampler is None:
        return None
    if _always_drops(sampler):
        return Drops(roots=True, unsampled=True, sampled=True)
    try:
        from opentelemetry.sdk.trace.sampling import ParentBased
    except ImportError:  # pragma: no cover
        return None
    if not isinstance(sampler, ParentBased):
        return None
    if type(sampler).should_sample is not ParentBased.should_sample:
        return None  # a subclass deciding its own way
    parts = vars(sampler)
    if not _always_drops(parts.get("_local_parent_not_sampled")):
        return None  # the handler's spans under an unsampled span could be recorded
    roots = _always_drops(parts.get("_root"))
    unsampled = _always_drops(parts.get("_remote_parent_not_sampled"))
    sampled = _always_drops(parts.get("_remote_parent_sampled"))
    if not (roots or unsampled or sampled):
        return None
    return Drops(roots=roots, unsampled=unsampled, sampled=sampled)
