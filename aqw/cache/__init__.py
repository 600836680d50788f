"""A Redis cache in front of a datastore: single-flight loads and versioned entries
(``Cache``, and ``CacheEntry``, what it stores)."""

from ._cache import Cache, CacheEntry

__all__ = ["Cache", "CacheEntry"]
