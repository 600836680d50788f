"""``aqw bench``: sweep processes, concurrency and prefetch on a throwaway queue."""

from ._main import add_parser, main, run

__all__ = ["add_parser", "main", "run"]
