"""KV caches: detection of a graph's cache layout (``detect``), one registry of kinds and the
choice among them (``planning``), one small class per kind."""

from .base import KVCache, KVCacheBase, KVLayout
from .detect import KNOWN_PATTERNS, configured_kv_pattern, detect_layout
from .planning import CACHE_KINDS, KVPlan, make_cache, plan_cache

__all__ = [
    "CACHE_KINDS",
    "KNOWN_PATTERNS",
    "KVCache",
    "KVCacheBase",
    "KVLayout",
    "KVPlan",
    "configured_kv_pattern",
    "detect_layout",
    "make_cache",
    "plan_cache",
]
