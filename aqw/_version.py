"""The package version (one place: the public ``aqw.__version__`` and telemetry read it)."""

__version__ = "0.1.0"
