"""Retry policy: exponential backoff with full jitter, a retry bound, and errors never retried."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from ._text import quoted
from .errors import ConfigError


def _finite(value: object) -> bool:
    """A finite number (a bool or a string is none)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a failing job is retried.

    A job runs at most ``max_retries + 1`` times. The delay before run ``n + 1`` (after the
    n-th failure) is drawn uniformly from ``[0, min(cap, base * 2 ** (n - 1))]`` ("full
    jitter"), so a burst of failures spreads out instead of retrying in lockstep. Errors
    that are instances of ``no_retry`` go to the dead-letter queue at once.
    """

    max_retries: int = 3
    base: float = 1.0
    cap: float = 300.0
    jitter: bool = True
    no_retry: tuple[type[BaseException], ...] = field(default=())

    def __post_init__(self) -> None:
        retries = self.max_retries
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigError(
                f"RetryPolicy max_retries must be an integer >= 0, got {quoted(retries)}"
            )
        if not _finite(self.base) or self.base <= 0:
            raise ConfigError(
                f"RetryPolicy base must be a finite number > 0, got {quoted(self.base)}"
            )
        if not _finite(self.cap):
            raise ConfigError(f"RetryPolicy cap must be a finite number, got {quoted(self.cap)}")
        if not isinstance(self.jitter, bool):
            raise ConfigError(
                f"RetryPolicy jitter must be True or False, got {quoted(self.jitter)}"
            )
        if self.cap < self.base:
            raise ConfigError(f"RetryPolicy cap ({self.cap!r}) must be >= base ({self.base!r})")

    def ceiling(self, attempt: int) -> float:
        """The largest delay after the ``attempt``-th run failed (attempt >= 1)."""
        exponent = min(max(attempt - 1, 0), 62)
        return min(self.cap, self.base * 2.0**exponent)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The delay before the next run after the ``attempt``-th run failed."""
        ceiling = self.ceiling(attempt)
        if not self.jitter:
            return ceiling
        return (rng or random).uniform(0.0, ceiling)

    def retries_left(self, attempt: int) -> bool:
        """True when a job whose ``attempt``-th run failed may run again."""
        return attempt <= self.max_retries

    def is_retryable(self, exc: BaseException) -> bool:
        """False for errors listed in ``no_retry``."""
        return not isinstance(exc, self.no_retry)

    def with_max_retries(self, max_retries: int) -> RetryPolicy:
        """A copy with another retry bound."""
        return RetryPolicy(max_retries, self.base, self.cap, self.jitter, self.no_retry)
