"""Routing policy: cache_aware's argmin, spill under load, the classic ones, SGLang thresholds."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.routing.policy import (
    COLD_WORK_SLACK,
    Decision,
    EngineLoad,
    NoEngineError,
    Policy,
    PolicyConfig,
)

BLOCK = 4


@dataclass
class _Match:
    confirmed_tokens: int
    optimistic_tokens: int


class BlockIndex:
    """A naive prefix index at the PrefixMatcher seam: full blocks of tokens per engine."""

    def __init__(self, engines: str = "abcdefgh") -> None:
        # Like radix.PrefixIndex after add_engine: every known engine matches (maybe 0 tokens).
        self.blocks: dict[str, set[tuple[Hashable, tuple[int, ...]]]] = {e: set() for e in engines}
        self.routed: list[str] = []
        self.removed: dict[str, dict[tuple[Hashable, tuple[int, ...]], float]] = {}

    def evict(self, engine: str, tokens: Sequence[int], keep: int, now: float,
              namespace: Hashable = None) -> None:
        """The engine removes the prompt's blocks past its first ``keep`` tokens at ``now``."""
        held, gone = self.blocks[engine], self.removed.setdefault(engine, {})
        for end in range(keep + BLOCK, len(tokens) + 1, BLOCK):
            block = (namespace, tuple(tokens[:end]))
            if block in held:
                held.discard(block)
                gone[block] = now

    def cut_short(self, engine: str, prompt: tuple[Sequence[int], Hashable], tokens: int,
                  since: float) -> bool:
        toks, namespace = prompt
        at = self.removed.get(engine, {}).get((namespace, tuple(toks[:tokens + BLOCK])))
        return tokens + BLOCK <= len(toks) and at is not None and at >= since

    def store(self, engine: str, tokens: Sequence[int], namespace: Hashable = None) -> None:
        held = self.blocks.setdefault(engine, set())
        for end in range(BLOCK, len(tokens) + 1, BLOCK):
            held.add((namespace, tuple(tokens[:end])))

    def match(self, tokens: Sequence[int], namespace: Hashable, now: float) -> dict[str, _Match]:
        out = {}
        for engine, held in self.blocks.items():
            n = 0
            while n + BLOCK <= len(tokens) and (namespace, tuple(tokens[: n + BLOCK])) in held:
                n += BLOCK
            out[engine] = _Match(n, n)
        return out

    def note_routed(
        self, engine: str, tokens: Sequence[int], namespace: Hashable, now: float, ttl: float
    ) -> None:
        self.routed.append(engine)
        self.store(engine, tokens, namespace)

    # The policy's calls: a prepared prompt is just (tokens, namespace) here.
    def prepare(
        self, tokens: Sequence[int], namespace: Hashable
    ) -> tuple[Sequence[int], Hashable]:
        return tokens, namespace

    def match_keys(self, prompt: tuple[Sequence[int], Hashable], now: float) -> dict[str, _Match]:
        return self.match(*prompt, now)

    def note_routed_keys(
        self, engine: str, prompt: tuple[Sequence[int], Hashable], now: float, ttl: float
    ) -> None:
        self.note_routed(engine, *prompt, now, ttl)


def _policy(name: str = "cache_aware", **kw: float | int | None) -> tuple[Policy, BlockIndex]:
    index = BlockIndex()
    return Policy(PolicyConfig(name=name, **kw), index), index  # type: ignore[arg-type]


PROMPT = list(range(100, 164))


def test_cache_aware_goes_to_the_prefix_holder() -> None:
    policy, index = _policy()
    index.store("b", PROMPT)
    loads = [EngineLoad("a"), EngineLoad("b"), EngineLoad("c")]
    d = policy.choose(PROMPT + [1, 2, 3], None, loads, now=0.0)
    assert d == Decision("b", 64, "prefix_hit")
    assert index.routed == ["b"]
    assert d.header() == "engine=b; cached=64; reason=prefix_hit"


def test_cache_aware_spills_when_the_holder_is_busy() -> None:
    policy, index = _policy(request_tokens=64)
    index.store("b", PROMPT)
    loads = [EngineLoad("a"), EngineLoad("b", in_flight=3, pending_prefill_tokens=200)]
    d = policy.choose(PROMPT + [1], None, loads, now=0.0)
    assert (d.engine, d.reason, d.cached_tokens) == ("a", "spill", 0)


def test_by_default_a_hit_waits_behind_at_most_twice_the_prefill_it_saves() -> None:
    """The defaults' trade (bench/compare.py's pressure): a prefill token queued on the holder
    weighs half a token to compute, a request in flight 16."""
    prompt = list(range(100, 1100))  # held whole on b: 999 tokens saved (vLLM recomputes one)

    def choose(b: EngineLoad) -> Decision:
        policy, index = _policy()
        index.store("b", prompt)
        return policy.choose(prompt, None, [EngineLoad("a"), b], 0.0)

    # b has 2000 tokens of cold prefill queued: 1 + (2000 + 2 x 32) / 2 > 1000 on idle a
    assert choose(EngineLoad("b", in_flight=2, pending_prefill_tokens=2000)).reason == "spill"
    # ... 1800: 1 + (1800 + 64) / 2 < 1000 (at the former quarter, up to 3868 queued)
    assert choose(EngineLoad("b", in_flight=2, pending_prefill_tokens=1800)).engine == "b"
    # Decoding requests weigh little: 40 of them (640) do not outweigh the hit.
    assert choose(EngineLoad("b", in_flight=40)).engine == "b"


def test_namespaces_do_not_share_a_prefix() -> None:
    policy, index = _policy()
    index.store("b", PROMPT, namespace="tenant-1")
    loads = [EngineLoad("a"), EngineLoad("b")]
    d = policy.choose(PROMPT, "tenant-2", loads, now=0.0)
    assert (d.cached_tokens, d.reason) == (0, "cold")


def test_optimistic_note_keeps_a_conversation_together() -> None:
    policy, _ = _policy()
    loads = [EngineLoad(e) for e in "abcd"]
    first = policy.choose(PROMPT, None, loads, now=0.0)
    again = policy.choose(PROMPT + [7, 8, 9, 10], None, loads, now=0.1)
    assert again.engine == first.engine and again.cached_tokens == len(PROMPT)


def test_full_hit_is_capped_below_the_prompt_length() -> None:
    policy, index = _policy()
    index.store("a", PROMPT)
    assert policy.choose(PROMPT, None, [EngineLoad("a")], now=0.0).cached_tokens == len(PROMPT) - 1


loads_st = st.lists(
    st.builds(
        EngineLoad,
        engine=st.sampled_from("abcdefgh"),
        in_flight=st.integers(0, 50),
        pending_prefill_tokens=st.integers(0, 5000),
        engine_running=st.integers(0, 50),
        engine_waiting=st.integers(0, 50),
    ),
    min_size=1,
    max_size=8,
    unique_by=lambda load: load.engine,
)


@given(
    loads=loads_st,
    held=st.dictionaries(st.sampled_from("abcdefgh"), st.integers(0, 16), max_size=8),
    weight=st.floats(0, 4),
)
def test_cache_aware_is_the_argmin_of_the_cost(
    loads: list[EngineLoad], held: dict[str, int], weight: float
) -> None:
    policy, index = _policy(load_weight=weight, request_tokens=32)
    tokens = list(range(16 * BLOCK + 3))
    for engine, blocks in held.items():
        index.store(engine, tokens[: blocks * BLOCK])
    d = policy.choose(tokens, None, list(reversed(loads)), now=0.0)

    def cost(load: EngineLoad) -> float:
        cached = held.get(load.engine, 0) * BLOCK
        reqs = max(load.in_flight, load.engine_running + load.engine_waiting)
        return len(tokens) - cached + weight * (load.pending_prefill_tokens + 32 * reqs)

    chosen = next(load for load in loads if load.engine == d.engine)
    best = max(held.get(load.engine, 0) * BLOCK for load in loads)
    cold = best < PolicyConfig().min_hit_fraction * len(tokens)
    if cold:
        # Cold, nothing remembered for this head (a fresh policy): about the least work.
        least = min(load.work(32) for load in loads)
        assert chosen.work(32) <= least * COLD_WORK_SLACK
        assert d.reason == "cold"
    else:
        assert cost(chosen) == pytest.approx(min(cost(load) for load in loads))
    assert d.cached_tokens == held.get(d.engine, 0) * BLOCK
    if not cold:
        assert d.reason == ("prefix_hit" if d.cached_tokens == best else "spill")
    # Deterministic: the same state in another order gives the same answer.
    policy2, index2 = _policy(load_weight=weight, request_tokens=32)
    for engine, blocks in held.items():
        index2.store(engine, tokens[: blocks * BLOCK])
    assert policy2.choose(tokens, None, loads, now=0.0).engine == d.engine


def test_cold_prompts_spread_and_stick() -> None:
    policy, _ = _policy()
    loads = [EngineLoad(e) for e in "abcd"]
    first = {policy.choose([p] * 40, f"ns{p}", loads, 0.0).engine for p in range(40)}
    assert len(first) == 4  # different prompt heads land on different idle engines
    again = [policy.choose([7] * 40, "x", loads, 0.0).engine for _ in range(3)]
    assert len(set(again)) == 1


def test_an_evicted_prefix_returns_to_its_engine() -> None:
    policy, index = _policy(cold_load_factor=2.0)
    idle = [EngineLoad(e) for e in "abcd"]
    home = policy.choose(PROMPT, None, idle, 0.0).engine
    # Evicted everywhere; its engine is now busier than the others, within 2x the mean.
    index.blocks[home].clear()
    loads = [EngineLoad(e, in_flight=2 if e == home else 1) for e in "abcd"]
    assert policy.choose(PROMPT, None, loads, 1.0) == Decision(home, 0, "cold")
    # Beyond the bound (one more would make 5 > 2 x (7 + 1) / 4): the least loaded instead.
    index.blocks[home].clear()
    loads = [EngineLoad(e, in_flight=4 if e == home else 1) for e in "abcd"]
    moved = policy.choose(PROMPT, None, loads, 2.0).engine
    assert moved != home
    # ...which is now the head's engine.
    index.blocks[moved].clear()
    loads = [EngineLoad(e, in_flight=2 if e == moved else 1) for e in "abcd"]
    assert policy.choose(PROMPT, None, loads, 3.0).engine == moved


@pytest.mark.parametrize("pending", [len(PROMPT), len(PROMPT) // 2])
def test_an_evicted_prefix_does_not_queue_behind_its_engines_cold_prefill(pending: int) -> None:
    """Its engine still computes another cold prompt (a whole one: more than half a prompt
    beyond the others' pending prefill) while the others only decode: the prompt goes to one of
    them, not to wait there (bench/compare.py's pressure workload: four cold prompts stacked on
    one engine within 0.33 s). Half a prompt or less to compute there: it goes home."""
    policy, index = _policy()
    home = policy.choose(PROMPT, None, [EngineLoad(e) for e in "abcd"], 0.0).engine
    index.blocks[home].clear()
    loads = [EngineLoad(e, in_flight=1, pending_prefill_tokens=pending if e == home else 0)
             for e in "abcd"]
    decision = policy.choose(PROMPT, None, loads, 1.0)
    assert decision.reason == "cold"
    assert (decision.engine == home) == (pending <= len(PROMPT) // 2)


def test_without_the_home_slack_an_evicted_prefix_waits_at_home() -> None:
    policy, index = _policy(cold_home_slack=math.inf)
    home = policy.choose(PROMPT, None, [EngineLoad(e) for e in "abcd"], 0.0).engine
    index.blocks[home].clear()
    loads = [EngineLoad(e, in_flight=1, pending_prefill_tokens=5000 if e == home else 0)
             for e in "abcd"]
    assert policy.choose(PROMPT, None, loads, 1.0).engine == home


def test_a_new_cold_prompt_goes_to_the_least_loaded_engine() -> None:
    policy, _ = _policy()
    loads = [EngineLoad("a", in_flight=2), EngineLoad("b", in_flight=1, pending_prefill_tokens=9),
             EngineLoad("c", in_flight=1), EngineLoad("d", in_flight=3)]
    assert policy.choose(PROMPT, None, loads, 0.0) == Decision("c", 0, "cold")


def test_engines_each_computing_a_cold_prefill_take_the_next_in_turn() -> None:
    """Every engine computes one cold prefill of about the same size: the next cold prompt goes
    to the engine given its prefill longest ago, the closest to done, not to the one given the
    shortest prompt (often the latest, where two prefills would then run at once); a cold burst
    goes round the fleet."""
    policy, _ = _policy()
    given: list[tuple[str, int]] = []  # (engine, its prompt's length), the latest per engine
    for p in range(12):
        size = 1500 + (p * 37) % 160
        latest = dict(given)
        loads = [EngineLoad(e, in_flight=1, pending_prefill_tokens=latest[e]) if e in latest
                 else EngineLoad(e) for e in "abcd"]
        given.append((policy.choose([p] * 40, f"t{p}", loads, 0.0).engine, size))
    order = [engine for engine, _ in given]
    assert sorted(order[:4]) == list("abcd")
    assert order[4:] == order[:4] * 2
    # Not when one of them has much more to compute: then the least work goes first.
    loads = [EngineLoad(e, in_flight=1, pending_prefill_tokens=3000 if e == order[-4] else 1500)
             for e in "abcd"]
    assert policy.choose([99] * 40, "t99", loads, 0.0).engine == order[-3]


def test_a_spill_is_not_remembered() -> None:
    policy, index = _policy(request_tokens=64)
    index.store("b", PROMPT)
    assert policy.choose(PROMPT, None, [EngineLoad("a"), EngineLoad("b")], 0.0).engine == "b"
    busy = [EngineLoad("a"), EngineLoad("b", in_flight=3, pending_prefill_tokens=200)]
    assert policy.choose(PROMPT + [1], None, busy, 0.0).reason == "spill"
    index.blocks["a"].clear()
    index.blocks["b"].clear()
    # Cold again: back to b (where the head last went as a hit), not to a (the spill).
    loads = [EngineLoad("a"), EngineLoad("b", in_flight=1)]
    assert policy.choose(PROMPT, None, loads, 1.0).engine == "b"


def test_home_memory_is_bounded_and_can_be_off() -> None:
    for memory in (0, 1):
        policy, index = _policy(home_memory=memory)
        idle = [EngineLoad(e) for e in "ab"]
        first = policy.choose(PROMPT, None, idle, 0.0).engine
        # Another head after it; with memory 1 it pushes the first head out.
        policy.choose([9] * 64, None, idle, 0.0)
        for held in index.blocks.values():
            held.clear()
        other = "b" if first == "a" else "a"
        loads = [EngineLoad(first, in_flight=1), EngineLoad(other)]
        assert policy.choose(PROMPT, None, loads, 1.0).engine == other
    with pytest.raises(ValueError):
        PolicyConfig(home_memory=-1)


def test_round_robin_is_fair() -> None:
    policy, _ = _policy("round_robin")
    loads = [EngineLoad(e) for e in "dcba"]
    picks = Counter(policy.choose(PROMPT, None, loads, 0.0).engine for _ in range(40))
    assert picks == {"a": 10, "b": 10, "c": 10, "d": 10}


def test_random_is_seeded() -> None:
    loads = [EngineLoad(e) for e in "abcdefgh"]
    runs = []
    for _ in range(2):
        policy, _ = _policy("random", seed=7)
        runs.append([policy.choose(PROMPT, None, loads, 0.0).engine for _ in range(30)])
    assert runs[0] == runs[1] and len(set(runs[0])) > 3


@given(loads=loads_st)
def test_power_of_two_never_picks_the_unique_maximum(loads: list[EngineLoad]) -> None:
    policy, _ = _policy("power_of_two", seed=1)
    d = policy.choose(PROMPT, None, loads, 0.0)
    top = max(load.requests for load in loads)
    if len(loads) > 1 and sum(load.requests == top for load in loads) == 1:
        assert next(x for x in loads if x.engine == d.engine).requests < top or all(
            load.requests == top for load in loads
        )


@given(loads=loads_st)
def test_shortest_queue_takes_the_fewest_requests(loads: list[EngineLoad]) -> None:
    policy, _ = _policy("shortest_queue")
    d = policy.choose(PROMPT, None, loads, 0.0)
    chosen = next(x for x in loads if x.engine == d.engine)
    assert chosen.requests == min(load.requests for load in loads)


def test_sglang_imbalance_goes_to_the_least_loaded() -> None:
    policy, index = _policy(
        cache_threshold=0.3, balance_abs_threshold=64, balance_rel_threshold=1.5
    )
    index.store("a", PROMPT)
    loads = [EngineLoad("a", in_flight=100), EngineLoad("b", in_flight=10)]
    assert policy.choose(PROMPT, None, loads, 0.0) == Decision("b", 0, "imbalance")
    # Balanced enough: SGLang's rule sends it to the holder even though it is busier.
    policy, index = _policy(
        cache_threshold=0.3, balance_abs_threshold=64, balance_rel_threshold=1.5
    )
    index.store("a", PROMPT)
    loads = [EngineLoad("a", in_flight=20), EngineLoad("b", in_flight=10)]
    assert policy.choose(PROMPT, None, loads, 0.0).engine == "a"


def test_sglang_cache_threshold() -> None:
    policy, index = _policy(cache_threshold=0.5)
    index.store("a", PROMPT[:8])
    loads = [EngineLoad("a", in_flight=1), EngineLoad("b")]
    assert policy.choose(PROMPT, None, loads, 0.0) == Decision("b", 0, "below_cache_threshold")
    policy, index = _policy(cache_threshold=0.5)
    index.store("a", PROMPT)
    assert policy.choose(PROMPT, None, loads, 0.0) == Decision("a", 63, "prefix_hit")


def test_engines_unknown_to_the_index_are_routed_but_not_noted() -> None:
    policy, index = _policy()
    d = policy.choose(PROMPT, None, [EngineLoad("zz")], 0.0)
    assert (d.engine, d.cached_tokens) == ("zz", 0) and index.routed == []


def test_errors() -> None:
    policy, _ = _policy()
    with pytest.raises(NoEngineError):
        policy.choose(PROMPT, None, [], 0.0)
    with pytest.raises(ValueError, match="unknown policy"):
        PolicyConfig(name="fastest")
    with pytest.raises(ValueError):
        PolicyConfig(cache_threshold=1.5)


def test_a_prefix_its_engine_is_evicting_counts_as_cold() -> None:
    """vLLM frees a finished request's blocks tail first: a prefix whose next block its engine
    just removed is being evicted, and the prefill queued there takes the rest. Its holder, with a
    prefill queued, would get the request as a hit; cut short, the prefix counts as cold."""
    prompt = list(range(1000, 1160))
    now = 100.0
    loads = [EngineLoad("a", in_flight=1, pending_prefill_tokens=100), EngineLoad("b")]

    def decide(removed_at: float | None, **kw: float) -> Decision:
        policy, index = _policy(**kw)
        if removed_at is None:  # the prompt goes on differently: its own tail never ran here
            index.store("a", prompt[:96])
        else:
            index.store("a", prompt)
            index.evict("a", prompt, 96, removed_at)
        return policy.choose(prompt, None, loads, now)

    assert decide(None) == Decision("a", 96, "prefix_hit")
    assert decide(now - 1.0) == Decision("b", 0, "cold")
    assert decide(now - 6.0) == Decision("a", 96, "prefix_hit")  # before eviction_window (5 s)
    assert decide(now - 1.0, eviction_window=0.0) == Decision("a", 96, "prefix_hit")  # off
    # A holder with no prefill queued (decoding only) schedules this request before any new
    # prefill evicts the rest: a hit there.
    policy, index = _policy()
    index.store("a", prompt)
    index.evict("a", prompt, 96, now)
    idle = [EngineLoad("a", in_flight=1), EngineLoad("b")]
    assert policy.choose(prompt, None, idle, now) == Decision("a", 96, "prefix_hit")
    # Alone, the holder gets it, its prefill counted whole (the dispatcher's uncached tokens).
    policy, index = _policy()
    index.store("a", prompt)
    index.evict("a", prompt, 96, now)
    assert policy.choose(prompt, None, loads[:1], now) == Decision("a", 0, "cold")
    # Another engine's whole prefix is a hit as before.
    policy, index = _policy()
    index.store("a", prompt)
    index.evict("a", prompt, 96, now)
    index.store("b", prompt)
    assert policy.choose(prompt, None, loads, now) == Decision("b", 159, "prefix_hit")


def test_the_eviction_window_is_checked() -> None:
    with pytest.raises(ValueError, match="eviction_window"):
        PolicyConfig(eviction_window=float("nan"))
    with pytest.raises(ValueError, match="eviction_window"):
        PolicyConfig(eviction_window=-1.0)
