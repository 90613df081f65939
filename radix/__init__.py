"""radix: per-engine prefix index over token blocks, fed by engines' KV-cache events."""

from radix.index import NO_MATCH, IndexStats, Match, PrefixIndex
from radix.namespace import Namespace, namespace_for, split_event_extra_keys

__all__ = [
    "NO_MATCH",
    "IndexStats",
    "Match",
    "Namespace",
    "PrefixIndex",
    "namespace_for",
    "split_event_extra_keys",
]
