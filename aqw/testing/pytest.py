"""aqw's pytest plugin: fixtures that run an app on fresh in-process queues in each test.

Enable it in your ``conftest.py`` (it is not loaded by itself, so installing aqw changes
no one's test run)::

    pytest_plugins = ["aqw.testing.pytest"]

or with ``-p aqw.testing.pytest`` on the command line. Then name your app in the pytest
configuration (``aqw_app = "myproject.jobs:app"`` under ``[tool.pytest.ini_options]``) and
take the ``aqw_app`` fixture, or wrap any app with the ``aqw_memory`` fixture. The fixtures
are synchronous (no event loop of their own), so they work under pytest-asyncio and
anyio's plugin alike.

- ``aqw_app``: the configured app on fresh ``memory://`` queues for this test, pointed
  back at its own broker afterwards.
- ``aqw_memory``: ``aqw_memory(app)`` does the same to any app, and returns it.
- ``aqw_eager``: the ``aqw_app`` in eager mode: each enqueue runs its job inline
  (``aqw.testing.eager``).

``await aqw.testing.run_until_idle(app)`` runs the queued jobs and returns their outcomes.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator

import pytest

from ..app import App
from .idle import eager, use_memory

__all__ = ["aqw_app", "aqw_eager", "aqw_memory", "load_app"]

INI = "aqw_app"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(INI, "the app of the aqw_app fixture, as module:attribute", default="")


def load_app(spec: str) -> App:
    """The App named ``module:attribute`` (``myproject.jobs:app``)."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise pytest.UsageError(f"{INI} = {spec!r}: name the app as module:attribute")
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise pytest.UsageError(f"{INI} = {spec!r}: {exc}") from exc
    if not isinstance(found, App):
        raise pytest.UsageError(f"{INI} = {spec!r} is a {type(found).__name__}, not an aqw.App")
    return found


@pytest.fixture
def aqw_memory() -> Iterator[Callable[[App], App]]:
    """``aqw_memory(app)``: ``app`` on fresh ``memory://`` queues until the test ends."""
    with contextlib.ExitStack() as stack:

        def on_memory(app: App) -> App:
            return stack.enter_context(use_memory(app))

        yield on_memory


@pytest.fixture
def aqw_app(request: pytest.FixtureRequest, aqw_memory: Callable[[App], App]) -> App:
    """The app named by the ``aqw_app`` ini option, on fresh ``memory://`` queues. Override
    this fixture to build the app another way (``return aqw_memory(make_app())``)."""
    spec = str(request.config.getini(INI) or "")
    if not spec:
        raise pytest.UsageError(
            f"the aqw_app fixture needs {INI} = 'module:app' in the pytest configuration "
            "(or a fixture of that name returning aqw_memory(your_app))"
        )
    return aqw_memory(load_app(spec))


@pytest.fixture
def aqw_eager(aqw_app: App) -> Iterator[App]:
    """``aqw_app`` in eager mode: each enqueue runs its job before it returns."""
    with eager(aqw_app) as app:
        yield app
