"""The routing policy: which engine gets one tokenized request, and why (one small class)."""

from __future__ import annotations

import math
import random
from array import array
from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import xxhash

_HEAD_TOKENS = 32  # prompt head hashed for the tie-break
# Engines whose work is within this factor of the least are as free for a cold prompt.
COLD_WORK_SLACK = 1.25
POLICIES = ("cache_aware", "shortest_queue", "round_robin", "power_of_two", "random")


class PrefixMatch(Protocol):
    @property
    def optimistic_tokens(self) -> int: ...


class PrefixMatcher(Protocol):
    """The calls of ``radix.PrefixIndex`` the policy needs.  ``prepare`` returns the prompt's
    block keys (opaque here), hashed once and shared by the match and the note."""

    def prepare(self, tokens: Sequence[int], namespace: Hashable) -> Any: ...

    def match_keys(self, prompt: Any, now: float) -> Mapping[str, PrefixMatch]: ...

    def note_routed_keys(self, engine: str, prompt: Any, now: float, ttl: float) -> object: ...

    def forget_routed(self, engine: str, tokens: Sequence[int], namespace: Hashable) -> None: ...

    def cut_short(self, engine: str, prompt: Any, tokens: int, since: float) -> bool: ...


def _head_hash(tokens: Sequence[int]) -> int:
    return xxhash.xxh3_64_intdigest(array("q", tokens[:_HEAD_TOKENS]).tobytes())


def _rendezvous_order(head: int, loads: Sequence[EngineLoad]) -> list[EngineLoad]:
    """Engines in rendezvous-hash order for a prompt head (stable as engines come and go)."""
    return sorted(loads, key=lambda load: (
        xxhash.xxh3_64_intdigest(load.engine.encode(), seed=head), load.engine))


def _nothing() -> None:
    return None


def _preferred(loads: Sequence[EngineLoad], lacks: Callable[[EngineLoad], bool]
               ) -> Sequence[EngineLoad]:
    """The loads that do not lack what the request prefers (its adapter), else all of them."""
    kept = [load for load in loads if not lacks(load)]
    return kept or loads


class NoEngineError(Exception):
    """No healthy engine with free capacity: the caller answers 503 / queues."""


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    name: str = "cache_aware"
    # Cost is in prompt tokens: one token of outstanding prefill weighs load_weight tokens, and one
    # running/queued request stands for request_tokens tokens of work (its decode steps), so a
    # request weighs load_weight * request_tokens = 16. A token of prefill queued weighs half of
    # one to compute (it was a quarter): on a fleet whose KV cache is outgrown, hits sent behind
    # an engine's cold prefills made the TTFT tail (bench/compare.py's pressure: p99 median 182
    # against 224 ms in alternating runs, hit rate and the other workloads unchanged; weighing
    # requests more, too, spread hot tenants over more engines in bench/router.py (c)).
    load_weight: float = 0.5
    request_tokens: float = 32.0
    # A cold prompt returns to the engine its head last went to unless that has more than this
    # factor times the fleet's mean load (in requests).
    cold_load_factor: float = 4.0
    # ... and unless its prompt tokens still to prefill exceed the fewest of any engine's by more
    # than this fraction of the prompt: a home still computing another cold prefill would make
    # this one wait for it while another engine is free (inf = no such bound).
    cold_home_slack: float = 0.5
    # A cached prefix shorter than this fraction of the prompt is treated as cold: chasing the
    # remnants that LRU eviction leaves on many engines would scatter a tenant across them.
    min_hit_fraction: float = 0.5
    # A cached prefix whose next block its engine removed within the last eviction_window
    # seconds counts as none there while a prefill is queued there (0 = off). vLLM frees a
    # finished request's blocks tail first, so a prefix cut short by eviction is evicted from its
    # end and what is left of it goes next: that queued prefill, scheduled before this request,
    # takes it (the index hears of it with that step's events, after the step). In
    # bench/compare.py's pressure, predictions of a prefix cut short found nothing in 29 of 62
    # cases (whole prefixes: 6 of 2042), and those unplanned cold prefills, on holders chosen
    # while busy, made the TTFT tail. As cold, the prompt still returns to its engine while that
    # is not busy with others. A holder with no prefill queued keeps the hit.
    eviction_window: float = 5.0
    # How long a routed-but-not-yet-confirmed prefix counts as cached on its engine.
    optimistic_ttl: float = 10.0
    # Prompt heads remembered with the engine they last went to (0 = off): a cold prompt whose
    # prefix was evicted returns there, else goes to the least loaded engine.
    home_memory: int = 65536
    seed: int = 0
    # SGLang's cache_aware knobs (None = off), for users who migrate from sgl-router.
    cache_threshold: float | None = None
    balance_abs_threshold: int | None = None
    balance_rel_threshold: float | None = None

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"unknown policy {self.name!r}; choose one of {', '.join(POLICIES)}")
        if self.load_weight < 0 or self.request_tokens < 0 or self.optimistic_ttl < 0:
            raise ValueError("load_weight, request_tokens and optimistic_ttl must be >= 0")
        if not 0.0 <= self.min_hit_fraction <= 1.0:
            raise ValueError("min_hit_fraction must be within [0, 1]")
        if not self.eviction_window >= 0:  # NaN fails too
            raise ValueError("eviction_window must be >= 0")
        if self.home_memory < 0:
            raise ValueError("home_memory must be >= 0")
        if self.cold_load_factor < 1:
            raise ValueError("cold_load_factor must be >= 1")
        if not self.cold_home_slack >= 0:  # NaN fails too
            raise ValueError("cold_home_slack must be >= 0")
        if self.cache_threshold is not None and not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError("cache_threshold must be within [0, 1]")


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """One engine's load as the router sees it at decision time."""

    engine: str
    in_flight: int = 0  # the router's own requests on this engine, not finished
    pending_prefill_tokens: int = 0  # uncached prompt tokens of those not yet past prefill
    engine_running: int = 0  # last scheduler_stats from the engine (lags by a step)
    engine_waiting: int = 0

    @property
    def requests(self) -> int:
        # The engine's counts include ours but lag; ours are fresh but miss other frontends.
        return max(self.in_flight, self.engine_running + self.engine_waiting)

    def work(self, request_tokens: float) -> float:
        return self.pending_prefill_tokens + request_tokens * self.requests


class Decision(NamedTuple):
    engine: str
    cached_tokens: int  # predicted prefix-cache hit on that engine, in prompt tokens
    reason: str

    def header(self) -> str:
        return f"engine={self.engine}; cached={self.cached_tokens}; reason={self.reason}"


class Policy:
    """Chooses an engine; the cache_aware path is the default and reads top to bottom."""

    def __init__(self, config: PolicyConfig, index: PrefixMatcher) -> None:
        self.config = config
        self.index = index
        self._rng = random.Random(config.seed)
        self._next = 0  # round-robin cursor (instance state, never shared)
        # The decision count when each engine was last chosen: among engines about as loaded,
        # a cold prompt goes to the one chosen longest ago (``_soonest_free``).
        self._decisions = 0
        self._last_chosen: dict[str, int] = {}
        self._homes: OrderedDict[int, str] = OrderedDict()  # prompt head -> last engine, LRU

    def choose(
        self, tokens: Sequence[int], namespace: Hashable, loads: Sequence[EngineLoad], now: float,
        holders: Collection[str] | None = None,
    ) -> Decision:
        """Pick among ``loads`` (healthy engines with capacity, any order) and note the route."""
        decision, note = self.decide(tokens, namespace, loads, now, holders)
        note()
        return decision

    def decide(
        self, tokens: Sequence[int], namespace: Hashable, loads: Sequence[EngineLoad], now: float,
        holders: Collection[str] | None = None,
    ) -> tuple[Decision, Callable[[], object]]:
        """``choose`` with the note in the index left to the caller: the dispatcher sends the
        request first and notes it right after, with no await in between (so no other decision
        can miss it), keeping the index update off the request's critical path.

        ``holders``: for a LoRA request, the engines holding its adapter loaded now; where
        cache_aware finds the cache hits equal, it prefers them (no adapter load before the
        request starts, and an adapter's requests keep to few engines)."""
        if not loads:
            raise NoEngineError("no healthy engine with free capacity")
        ordered = sorted(loads, key=lambda load: load.engine)  # determinism across callers
        prompt = self.index.prepare(tokens, namespace)
        cached = self._predicted_cached(tokens, namespace, now, prompt, loads)
        name = self.config.name
        if name == "cache_aware":
            load, reason = self._cache_aware(tokens, cached, ordered, holders)
        elif name == "shortest_queue":
            load, reason = self._least_loaded(ordered), "shortest_queue"
        elif name == "round_robin":
            load, reason = ordered[self._next % len(ordered)], "round_robin"
            self._next += 1
        elif name == "power_of_two":
            pair = self._rng.sample(ordered, 2) if len(ordered) > 1 else ordered
            load, reason = self._least_loaded(sorted(pair, key=lambda x: x.engine)), "power_of_two"
        else:
            load, reason = self._rng.choice(ordered), "random"
        self._decisions += 1
        self._last_chosen[load.engine] = self._decisions
        if len(self._last_chosen) > 2 * len(loads) + 16:  # engines gone since (names churn)
            self._last_chosen = {n: self._last_chosen[n] for n in (x.engine for x in loads)
                                 if n in self._last_chosen}
        decision = Decision(load.engine, cached.get(load.engine, 0), reason)
        if load.engine not in cached:  # engines without a block size yet are not in the index
            return decision, _nothing
        index, ttl = self.index, self.config.optimistic_ttl
        return decision, lambda: index.note_routed_keys(load.engine, prompt, now, ttl)

    def _cache_aware(
        self, tokens: Sequence[int], cached: dict[str, int], loads: Sequence[EngineLoad],
        holders: Collection[str] | None = None,
    ) -> tuple[EngineLoad, str]:
        cfg = self.config
        n_tokens = len(tokens)

        def lacks(load: EngineLoad) -> bool:
            """Not holding the request's adapter loses ties of cache hits (and of cost)."""
            return holders is not None and load.engine not in holders

        # 1. SGLang's escape hatch: a badly imbalanced fleet goes to the least loaded engine.
        if cfg.balance_abs_threshold is not None and cfg.balance_rel_threshold is not None:
            counts = [load.requests for load in loads]
            if (
                max(counts) - min(counts) > cfg.balance_abs_threshold
                and max(counts) > min(counts) * cfg.balance_rel_threshold
            ):
                return self._least_loaded(loads), "imbalance"
        # 2. SGLang's threshold rule: enough cached -> the longest holder, else the least loaded.
        best = max((cached.get(load.engine, 0) for load in loads), default=0)
        if cfg.cache_threshold is not None:
            if best <= cfg.cache_threshold * n_tokens:
                return self._least_loaded(loads), "below_cache_threshold"
            best_loads = [load for load in loads if cached.get(load.engine, 0) == best]
            return self._least_loaded(_preferred(best_loads, lacks)), "prefix_hit"
        # 3. Nothing (much) cached anywhere: the engine this prompt head last went to, within a
        # load bound, else the least loaded engine (ties in rendezvous-hash order of the head).
        # A tenant whose prefix was evicted thus returns to its engine instead of copying its
        # prefix to a second one (each copy evicts another tenant's), and new tenants spread by
        # load, not by hash (hashing can pack an engine with more prefixes than its KV cache holds).
        head = _head_hash(tokens)
        ranked = _rendezvous_order(head, loads)
        if best < cfg.min_hit_fraction * n_tokens:
            # Cold everywhere: among the adapter's holders if one is within the load bound.
            total = sum(load.requests for load in loads)
            bound = math.ceil(cfg.cold_load_factor * (total + 1) / len(loads))
            pool = _preferred(ranked, lacks)
            if min(load.requests for load in pool) + 1 > bound:
                pool = ranked
            last = self._homes.get(head)
            home = next((load for load in pool if load.engine == last), None)
            if home is not None and (
                home.requests + 1 > bound
                or home.pending_prefill_tokens > min(load.pending_prefill_tokens for load in pool)
                + cfg.cold_home_slack * n_tokens
            ):
                home = None
            return self._remember(head, home or self._soonest_free(pool)), "cold"
        # 4. The cost: prompt tokens still to compute here + the work already queued here
        # (ties in rendezvous order, so a spilled prefix also keeps to one engine).
        order = {load.engine: i for i, load in enumerate(ranked)}

        def cost(load: EngineLoad) -> tuple[float, bool, int, int]:
            uncached = n_tokens - cached.get(load.engine, 0)
            return (uncached + cfg.load_weight * load.work(cfg.request_tokens), lacks(load),
                    load.requests, order[load.engine])

        choice = min(loads, key=cost)
        hit = cached.get(choice.engine, 0)
        if hit < best:
            return choice, "spill"  # the holder of the longest prefix was too busy
        return self._remember(head, choice), "prefix_hit"

    def _remember(self, head: int, load: EngineLoad) -> EngineLoad:
        # A spill is not remembered: the tenant's home stays with its (busy) prefix holder.
        if self.config.home_memory:
            homes = self._homes
            homes[head] = load.engine
            homes.move_to_end(head)
            if len(homes) > self.config.home_memory:
                homes.popitem(last=False)
        return load

    def _least_loaded(self, loads: Sequence[EngineLoad]) -> EngineLoad:
        """Fewest requests, then least work; ties go to the first in ``loads``' order."""
        rt = self.config.request_tokens
        return min(loads, key=lambda load: (load.requests, load.work(rt)))

    def _soonest_free(self, loads: Sequence[EngineLoad]) -> EngineLoad:
        """For a cold prompt: among the engines with about the least work (within
        COLD_WORK_SLACK of it), the one chosen longest ago. Work, not the
        count of requests: an engine decoding two answers is free before one computing a cold
        prefill (counting requests first sent cold prompts behind prefills in progress while an
        engine only decoded: bench/compare.py's pressure workload, its first seconds).

        Work is a count of tokens, not a time: engines that each compute one cold prefill
        have about the same work, and the one given its prefill longest ago is the closest to
        done. Going by the token count alone sends the next cold prompt to whichever was given
        the shortest prompt, often the one given its prefill last: two prefills then run at
        once there, each slower, while another engine frees up (the first second of a run,
        when every prompt is cold)."""
        rt = self.config.request_tokens
        least = min(load.work(rt) for load in loads)
        near = [load for load in loads if load.work(rt) <= least * COLD_WORK_SLACK]
        last = self._last_chosen
        return min(near, key=lambda load: (last.get(load.engine, 0), load.work(rt)))

    def _predicted_cached(
        self, tokens: Sequence[int], namespace: Hashable, now: float, prompt: Any,
        loads: Sequence[EngineLoad],
    ) -> dict[str, int]:
        # vLLM always recomputes the last prompt token, so a full hit is at most len - 1.
        cap = max(len(tokens) - 1, 0)
        matches = self.index.match_keys(prompt, now)
        cached = {engine: min(m.optimistic_tokens, cap) for engine, m in matches.items()}
        window = self.config.eviction_window
        if window > 0:  # a prefix its engine is evicting, before a prefill (PolicyConfig)
            for load in loads:
                hit = cached.get(load.engine, 0)
                if (load.pending_prefill_tokens and 0 < hit < cap
                        and self.index.cut_short(load.engine, prompt, hit, now - window)):
                    cached[load.engine] = 0
        return cached
