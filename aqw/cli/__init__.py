"""The ``aqw`` command line: the only code that parses argv, prints for a person or installs
signal handlers. ``aqw worker``, ``enqueue``, ``status``, ``monitor``, ``dlq``, ``bench``."""

from ._main import main

__all__ = ["main"]
