"""radix: per-engine prefix index over token blocks, fed by engines' KV-cache events."""

from radix.index import NO_MATCH, IndexStats, Match, PrefixIndex
from radix.namespace import Namespace, namespace_for, split_event_extra_keys
from radix.prompt import PromptKeys

__all__ = [
    "NO_MATCH",
    "IndexStats",
    "Match",
    "Namespace",
    "PrefixIndex",
    "PromptKeys",
    "namespace_for",
    "split_event_extra_keys",
]
