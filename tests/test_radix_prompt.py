"""PromptKeys: lazily extended keys equal the keys hashed in one go, per block size."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from radix import PrefixIndex, PromptKeys
from radix.keys import block_keys, root_key, token_bytes


@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(st.integers(0, 2**32 - 1), max_size=80),
       size=st.sampled_from([1, 3, 4, 16]),
       stops=st.lists(st.integers(0, 30), max_size=5),
       ns=st.sampled_from([None, ("lora", None), (None, "salt")]))
def test_keys_extend_to_the_one_shot_chain(tokens: list[int], size: int, stops: list[int],
                                           ns: object) -> None:
    prompt = PromptKeys(tokens, ns)
    whole = block_keys(token_bytes(tokens), size, root_key(size, ns))
    assert prompt.blocks(size) == len(whole)
    for stop in stops:
        stop = min(stop, prompt.blocks(size))
        assert prompt.keys(size, stop)[:stop] == whole[:stop]
    # Another block size in between never disturbs the first one's chain.
    other = 2 if size != 2 else 5
    assert prompt.keys(other, prompt.blocks(other))[: prompt.blocks(other)] == block_keys(
        token_bytes(tokens), other, root_key(other, ns))
    assert prompt.keys(size, len(whole))[: len(whole)] == whole


def test_a_prepared_prompt_routes_like_the_token_calls() -> None:
    tokens = list(range(40))
    by_keys, by_tokens = PrefixIndex(100), PrefixIndex(100)
    for index in (by_keys, by_tokens):
        index.add_engine("a", 4)
        index.add_engine("b", 8)
        index.apply_stored("a", [1, 2], None, tokens[:8], None, 0.0)
    prompt = by_keys.prepare(tokens, None)
    assert by_keys.match_keys(prompt, 1.0) == by_tokens.match(tokens, None, 1.0)
    assert by_keys.note_routed_keys("b", prompt, 1.0, 5.0) == 5
    assert by_tokens.note_routed("b", tokens, None, 1.0, 5.0) == 5
    assert by_keys.match_keys(prompt, 2.0) == by_tokens.match(tokens, None, 2.0)
    assert by_keys.match(tokens, None, 2.0)["b"].optimistic_tokens == 40
