"""cache_aware and a LoRA request: engines holding its adapter win when cache hits are equal."""

from __future__ import annotations

from router.routing.policy import EngineLoad, Policy, PolicyConfig
from tests.test_router_policy import PROMPT, BlockIndex

NS = ("sql", None)


def _policy(**kw: float | int | None) -> tuple[Policy, BlockIndex]:
    index = BlockIndex("ab")
    return Policy(PolicyConfig(**kw), index), index  # type: ignore[arg-type]


def _cold_prompts() -> list[list[int]]:
    return [[1000 + i] * 8 + PROMPT for i in range(16)]


def test_cold_prompts_go_to_the_holder() -> None:
    policy, _ = _policy(home_memory=0)
    loads = [EngineLoad("a"), EngineLoad("b")]
    spread = {policy.decide(p, NS, loads, 0.0)[0].engine for p in _cold_prompts()}
    assert spread == {"a", "b"}  # without a holder, cold prompts spread by their head
    for holders in ({"a"}, {"b"}):
        got = {policy.decide(p, NS, loads, 0.0, holders)[0].engine for p in _cold_prompts()}
        assert got == holders


def test_an_overloaded_holder_does_not_take_every_cold_prompt() -> None:
    policy, _ = _policy(home_memory=0, cold_load_factor=1.0)
    loads = [EngineLoad("a", in_flight=9), EngineLoad("b")]
    assert {policy.decide(p, NS, loads, 0.0, {"a"})[0].engine for p in _cold_prompts()} == {"b"}


def test_equal_hits_go_to_the_holder_a_longer_hit_wins() -> None:
    policy, index = _policy()
    index.store("a", PROMPT, NS)
    index.store("b", PROMPT, NS)
    loads = [EngineLoad("a"), EngineLoad("b")]
    for holder in ("a", "b"):
        assert policy.decide(PROMPT + [1], NS, loads, 0.0, {holder})[0].engine == holder
    index.store("a", PROMPT + [1, 2, 3, 4], NS)
    d, _ = policy.decide(PROMPT + [1, 2, 3, 4, 5], NS, loads, 0.0, {"b"})
    assert (d.engine, d.reason) == ("a", "prefix_hit")  # the cache outweighs the adapter


def test_threshold_rule_prefers_the_holder_among_the_longest() -> None:
    policy, index = _policy(cache_threshold=0.5)
    index.store("a", PROMPT, NS)
    index.store("b", PROMPT, NS)
    loads = [EngineLoad("a"), EngineLoad("b")]
    assert policy.decide(PROMPT + [1], NS, loads, 0.0, {"b"})[0].engine == "b"
    assert policy.decide(PROMPT + [1], NS, loads, 0.0, {"a"})[0].engine == "a"
