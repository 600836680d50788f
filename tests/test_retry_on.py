"""Retry only these errors (Celery's ``autoretry_for``): ``RetryPolicy(retry_on=...)`` and
its shorthand ``@app.task(retry_on=...)``. Any other error dead-letters the job at once; a
requested ``aqw.Retry`` is retried whatever the list says; ``no_retry`` still wins."""

from __future__ import annotations

from collections import Counter

import pytest
from conftest import Backend

import aqw
from tests._helpers import run_burst

pytestmark = pytest.mark.timeout(60)

FAST = {"base": 0.01, "cap": 0.02}


class Flaky(ConnectionError):
    """An error of the kind that goes away (a subclass of a listed one)."""


def test_retry_on_lists_the_only_errors_retried() -> None:
    policy = aqw.RetryPolicy(retry_on=(ConnectionError, TimeoutError))
    assert policy.is_retryable(ConnectionError()) and policy.is_retryable(TimeoutError())
    assert policy.is_retryable(Flaky())  # subclasses too
    assert not policy.is_retryable(ValueError())
    assert aqw.RetryPolicy().is_retryable(ValueError())  # none listed: every error
    both = aqw.RetryPolicy(retry_on=(ConnectionError,), no_retry=(Flaky,))
    assert not both.is_retryable(Flaky()) and both.is_retryable(ConnectionError())
    assert policy.with_max_retries(9).retry_on == (ConnectionError, TimeoutError)
    assert aqw.RetryPolicy(retry_on=TimeoutError).retry_on == (TimeoutError,)  # a lone class
    assert aqw.RetryPolicy(retry_on=[KeyError]).retry_on == (KeyError,)


@pytest.mark.parametrize("bad", ["TimeoutError", (TimeoutError, 3), 42])
def test_anything_but_exception_classes_is_refused(bad: object) -> None:
    with pytest.raises(aqw.ConfigError, match="RetryPolicy retry_on must be exception classes"):
        aqw.RetryPolicy(retry_on=bad)  # type: ignore[arg-type]
    app = aqw.App()
    with pytest.raises(aqw.ConfigError, match="task 'picky': retry_on must be exception"):

        @app.task(name="picky", retry_on=bad)  # type: ignore[call-overload]
        async def picky() -> None: ...


async def test_a_listed_error_is_retried_any_other_is_dead_lettered_at_once(
    backend: Backend,
) -> None:
    app = backend.app(retry=aqw.RetryPolicy(max_retries=3, **FAST))
    runs: Counter[str] = Counter()

    @app.task(name="fetch", retry_on=(ConnectionError,), max_retries=2)
    async def fetch(kind: str, ctx: aqw.Context) -> None:
        runs[kind] += 1
        if kind == "retry" and ctx.attempt == 1:
            raise aqw.Retry(0.01)  # asked for: retried whatever retry_on lists
        if kind == "flaky":
            raise Flaky("the upstream hung up")
        if kind == "broken":
            raise ValueError("a bug: retrying cannot help")

    for kind in ("flaky", "broken", "retry"):
        await fetch.enqueue(kind)
    await run_burst(app)
    assert runs == {"flaky": 3, "broken": 1, "retry": 2}
    dead = {d.error_type: d.attempts for d in await app.dlq.list()}
    assert dead == {"Flaky": 3, "ValueError": 1}
    assert fetch.options.retry.max_retries == 2  # max_retries and retry_on together
