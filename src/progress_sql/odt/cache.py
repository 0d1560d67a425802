"""The LRU cache of gold ODT profiles: one gold is compared with many predictions
(G rollouts × T turns), so its tree is built once. Predictions are never cached."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import NamedTuple

from progress_sql.odt.settings import ODTSettings, default_odt
from progress_sql.odt.normalize import normalize_text
from progress_sql.odt.profile import Node, try_build_tree


class CacheInfo(NamedTuple):
    hits: int
    misses: int
    maxsize: int
    currsize: int


class ProfileCache:
    """Thread-safe LRU map from normalised gold text to its tree (None: not profilable).
    The size comes with each lookup (``settings.profile_cache_size``); 0 disables caching."""

    def __init__(self) -> None:
        self._data: OrderedDict[str, Node | None] = OrderedDict()
        self._lock = threading.Lock()
        self._maxsize = 0
        self.hits = self.misses = 0

    def get(self, sql: str, maxsize: int) -> Node | None:
        key = normalize_text(sql)
        with self._lock:
            self._maxsize = maxsize
            if key in self._data:
                self.hits += 1
                self._data.move_to_end(key)
                return self._data[key]
            self.misses += 1
        tree = try_build_tree(key)  # built outside the lock: parsing is the slow part
        with self._lock:
            if maxsize > 0:
                self._data[key] = tree
                while len(self._data) > maxsize:
                    self._data.popitem(last=False)
        return tree

    def info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(self.hits, self.misses, self._maxsize, len(self._data))

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0


_GOLD = ProfileCache()


def gold_profile(gold_sql: str, settings: ODTSettings | None = None) -> Node | None:
    """The gold query's ODT from the LRU cache (size ``settings.profile_cache_size``);
    None when the gold does not parse or is not a query. Never raises."""
    if not isinstance(gold_sql, str):
        return None
    size = (settings or default_odt()).profile_cache_size
    return _GOLD.get(gold_sql, size)


gold_profile.cache_info = _GOLD.info  # type: ignore[attr-defined]
gold_profile.cache_clear = _GOLD.clear  # type: ignore[attr-defined]
