"""Testing with aqw.

- ``run_until_idle(app)``, ``eager(app)`` and ``use_memory(app)`` run an app's jobs in a
  test, in-process (``docs/testing.md``); ``aqw.testing.pytest`` is the pytest plugin
  with the fixtures around them (``pytest_plugins = ["aqw.testing.pytest"]``);
  ``MockClock`` makes time pass without waiting, on the loop and on ``memory://``.
- ``aqw.testing.contract`` is the broker contract suite, for a broker written outside
  aqw (``docs/brokers/writing-a-broker.md``).

The plugin and the contract suite need pytest (and the suite pytest-asyncio:
``pip install 'aqw[testing]'``); nothing else of aqw imports this package."""

from .clock import MockClock
from .idle import Outcomes, eager, queues_of, run_until_idle, use_memory

__all__ = ["MockClock", "Outcomes", "eager", "queues_of", "run_until_idle", "use_memory"]
