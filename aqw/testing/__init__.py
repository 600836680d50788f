"""Testing with aqw: ``aqw.testing.contract`` is the broker contract suite, for a broker
written outside aqw (``docs/brokers/writing-a-broker.md``). It needs pytest and
pytest-asyncio (``pip install 'aqw[testing]'``); nothing else of aqw imports it."""
