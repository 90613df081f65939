"""Bench-only routing policies for bench/router.py: an SGLang-style character tree and an oracle.

Neither ships in the product. The character tree mirrors sgl-router's cache_aware decision
(imbalance thresholds, match-rate threshold, deepest holder, router in-flight as load) over a tree
keyed by characters in 32-character steps; the oracle reads every simulated engine's real block
cache and then applies kvroute's cost, so it bounds what any predictor can reach.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence

from router.routing.policy import Decision, EngineLoad, Policy, PolicyConfig
from sim.engine import SimEngine
from sim.prefix_cache import chain_hashes, namespace_root

STEP = 32  # characters per tree edge


class _Node:
    __slots__ = ("children", "engines")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.engines: dict[str, None] = {}  # insertion ordered: most recent last


class CharTreePolicy:
    """sgl-router cache_aware: a guess from routing history, keyed by the prompt's characters."""

    def __init__(self, text_of: Callable[[Sequence[int]], str], cache_threshold: float = 0.3,
                 balance_abs: int = 64, balance_rel: float = 1.5) -> None:
        self.config = PolicyConfig(name="cache_aware")  # metrics label only
        self.text_of = text_of
        self.root = _Node()
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel

    def choose(self, tokens: Sequence[int], namespace: Hashable, loads: Sequence[EngineLoad],
               now: float) -> Decision:
        text = self.text_of(tokens)
        names = {load.engine for load in loads}
        counts = {load.engine: load.in_flight for load in loads}
        least = min(sorted(names), key=lambda e: counts[e])
        hi, lo = max(counts.values()), min(counts.values())
        if hi - lo > self.balance_abs and hi > lo * self.balance_rel:
            engine, reason = least, "imbalance"
        else:
            node, matched, holder = self.root, 0, None
            for i in range(0, len(text) - STEP + 1, STEP):
                child = node.children.get(text[i:i + STEP])
                if child is None:
                    break
                alive = [e for e in child.engines if e in names]
                if not alive:
                    break
                node, matched, holder = child, i + STEP, alive[-1]
            if holder is not None and matched / max(len(text), 1) > self.cache_threshold:
                engine, reason = holder, "prefix_hit"
            else:
                engine, reason = least, "cold"
        self._insert(text, engine)
        return Decision(engine, 0, reason)

    def decide(self, tokens: Sequence[int], namespace: Hashable, loads: Sequence[EngineLoad],
               now: float, holders: Collection[str] | None = None
               ) -> tuple[Decision, Callable[[], None]]:
        """The Dispatcher's entry point: the tree is updated in ``choose`` already. ``holders``
        (a LoRA adapter's engines) is not known to sgl-router's tree: this bench sends none."""
        return self.choose(tokens, namespace, loads, now), lambda: None

    def _insert(self, text: str, engine: str) -> None:
        node = self.root
        for i in range(0, len(text) - STEP + 1, STEP):
            key = text[i:i + STEP]
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = _Node()
            child.engines.pop(engine, None)
            child.engines[engine] = None
            node = child


class OraclePolicy(Policy):
    """kvroute's cost, but with every engine's TRUE cached prefix read from its block pool."""

    def __init__(self, config: PolicyConfig, index: object, engines: dict[str, SimEngine]):
        super().__init__(config, index)  # type: ignore[arg-type]
        self.engines = engines

    def _predicted_cached(self, tokens: Sequence[int], namespace: Hashable,
                          now: float, prompt: object = None,
                          loads: Sequence[object] = ()) -> dict[str, int]:
        out = {}
        cap = max(len(tokens) - 1, 0)
        for name, engine in self.engines.items():
            pool = engine.scheduler.pool
            hashes = chain_hashes(tokens, pool.block_size, namespace_root(None, None, None), [])
            try:
                hit = len(pool.longest_hit(hashes, len(hashes))) * pool.block_size
            except RuntimeError:  # the engine thread mutated the dict mid-read: count as 0
                hit = 0
            out[name] = min(hit, cap)
        return out
