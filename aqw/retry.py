"""Retry policy: exponential backoff with full jitter, a retry bound, and errors never retried."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

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
    that are instances of ``no_retry`` go to the dead-letter queue at once; with
    ``retry_on`` (Celery's ``autoretry_for``), only instances of those are retried and
    every other error goes there at once. A requested ``aqw.Retry`` is retried either way.
    """

    max_retries: int = 3
    base: float = 1.0
    cap: float = 300.0
    jitter: bool = True
    no_retry: tuple[type[BaseException], ...] = field(default=())
    retry_on: tuple[type[BaseException], ...] = field(default=())

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
        for name in ("no_retry", "retry_on"):
            object.__setattr__(
                self, name, error_classes(f"RetryPolicy {name}", getattr(self, name))
            )

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
        """False for errors listed in ``no_retry``, and, when ``retry_on`` lists some, for
        every error that is none of them."""
        if isinstance(exc, self.no_retry):
            return False
        return not self.retry_on or isinstance(exc, self.retry_on)

    def with_max_retries(self, max_retries: int) -> RetryPolicy:
        """A copy with another retry bound."""
        return replace(self, max_retries=max_retries)

    def with_retry_on(self, errors: tuple[type[BaseException], ...]) -> RetryPolicy:
        """A copy that retries only instances of ``errors``."""
        return replace(self, retry_on=errors)


def error_classes(what: str, value: object) -> tuple[type[BaseException], ...]:
    """``value`` (an exception class, or a tuple or list of them) as a tuple; anything else
    is a ConfigError naming ``what``."""
    errors = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not all(isinstance(e, type) and issubclass(e, BaseException) for e in errors):
        raise ConfigError(f"{what} must be exception classes, got {value!r}")
    return errors
