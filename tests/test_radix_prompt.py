"""Block keys: the numpy and Python chains agree, PromptKeys extends lazily, keys stay secret."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radix import PrefixIndex, PromptKeys
from radix.keys import NUMPY_MIN_BLOCKS, KeySpace, token_array


def python_chain(space: KeySpace, tokens: list[int], size: int, seed: int) -> list[int]:
    """The definition (radix/keys.py), one block at a time with Python ints."""
    out, key = [], seed
    for i in range(len(tokens) // size):
        digits = tokens[i * size : (i + 1) * size]
        block = sum(t << (32 * j) for j, t in enumerate(digits))
        key = (key * space.base + block) % space.modulus
        out.append(key)
    return out


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), size=st.sampled_from([1, 3, 16, 128]),
       blocks=st.integers(0, 3 * NUMPY_MIN_BLOCKS), first=st.integers(0, 20),
       big=st.sampled_from([150_000, 2**24, 2**32]))
def test_numpy_and_python_chains_are_the_definition(seed: int, size: int, blocks: int,
                                                    first: int, big: int) -> None:
    rng = random.Random(seed)
    space = KeySpace(rng)
    tokens = [rng.randrange(big) for _ in range(blocks * size + rng.randrange(size))]
    root = space.root(size, None)
    whole = python_chain(space, tokens, size, root)
    assert space.chain(token_array(tokens), size, root) == whole
    assert all(0 <= k < space.modulus < 2**60 for k in whole)
    first = min(first, blocks)
    seed_key = whole[first - 1] if first else root
    # Resumed from any block (a child event continuing its parent, a lazily extended prompt).
    assert space.chain(token_array(tokens), size, seed_key, first) == whole[first:]


@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(st.integers(0, 2**32 - 1), max_size=80),
       size=st.sampled_from([1, 3, 4, 16]),
       stops=st.lists(st.integers(0, 30), max_size=5),
       ns=st.sampled_from([None, ("lora", None), (None, "salt")]))
def test_keys_extend_to_the_one_shot_chain(tokens: list[int], size: int, stops: list[int],
                                           ns: object) -> None:
    index = PrefixIndex(10)
    prompt = index.prepare(tokens, ns)
    space = prompt.space
    whole = python_chain(space, tokens, size, space.root(size, ns))
    assert prompt.blocks(size) == len(whole)
    for stop in stops:
        stop = min(stop, prompt.blocks(size))
        assert prompt.keys(size, stop)[:stop] == whole[:stop]
    # Another block size in between never disturbs the first one's chain.
    other = 2 if size != 2 else 5
    assert prompt.keys(other, prompt.blocks(other))[: prompt.blocks(other)] == python_chain(
        space, tokens, other, space.root(other, ns))
    assert prompt.keys(size, len(whole))[: len(whole)] == whole


def test_long_prompts_take_the_vectorised_path_and_match_like_short_ones() -> None:
    rng = random.Random(3)
    tokens = [rng.randrange(150_000) for _ in range(16 * 300)]
    index = PrefixIndex(10_000)
    index.add_engine("a", 16)
    # Ingest one block per event (Python path), match the whole prompt (numpy path).
    parent = None
    for i in range(300):
        index.apply_stored("a", [i + 1], parent, tokens[16 * i : 16 * (i + 1)], None, 0.0)
        parent = i + 1
    assert index.match(tokens, None, 1.0)["a"].confirmed_tokens == 16 * 300
    assert index.match(tokens[:-1], None, 1.0)["a"].confirmed_tokens == 16 * 299
    changed = tokens[:]
    changed[16 * 200 + 7] += 1
    assert index.match(changed, None, 1.0)["a"].confirmed_tokens == 16 * 200


def test_thue_morse_prompts_do_not_collide() -> None:
    """Polynomial hashing mod 2**64 maps these two prompts to one key for EVERY odd base
    (the product of (1 - b**(2**i)) has 2-adic valuation >= 64 after 10 doublings); keys
    modulo secret primes keep them apart."""
    a, b = [7] * 16, [9] * 16
    thue = [0]
    for _ in range(10):
        thue += [1 - t for t in thue]  # 1,024 blocks
    one = [tok for t in thue for tok in (a if t else b)]
    two = [tok for t in thue for tok in (b if t else a)]
    base = random.Random(1).getrandbits(64) | 1

    def mod64(tokens: list[int]) -> int:
        key = 0
        for i in range(0, len(tokens), 16):
            key = (key * base + sum(t << (32 * j) for j, t in enumerate(tokens[i : i + 16]))) \
                % 2**64
        return key

    assert mod64(one) == mod64(two)  # the attack is real
    index = PrefixIndex(10)
    assert index.prepare(one, None).keys(16, 1024)[-1] != index.prepare(two, None).keys(
        16, 1024)[-1]


def test_keys_differ_per_index_and_per_block_size_or_namespace() -> None:
    tokens = list(range(64))
    one, two = PrefixIndex(10), PrefixIndex(10)
    assert one.prepare(tokens, None).keys(16, 4) != two.prepare(tokens, None).keys(16, 4)
    space = one.prepare(tokens, None).space
    roots = {space.root(size, ns) for size in (1, 16, 128)
             for ns in (None, ("lora", None), (None, "salt"), ("lora", "salt"))}
    assert len(roots) == 12
    with pytest.raises(ValueError, match="another index"):
        one.match_keys(two.prepare(tokens, None), 1.0)


def test_token_ids_outside_uint32_are_rejected_not_aliased() -> None:
    index = PrefixIndex(10)
    index.add_engine("a", 4)
    assert index.apply_stored("a", [1], None, [0, 1, 2, 2**32], None, 0.0) == 0
    assert index.apply_stored("a", [1], None, [0, 1, 2, -1], None, 0.0) == 0
    assert index.stats.skipped_events == 2
    with pytest.raises(OverflowError):
        index.match([0, 1, 2, 2**32], None, 1.0)


def test_a_prepared_prompt_routes_like_the_token_calls() -> None:
    tokens = list(range(40))
    by_keys, by_tokens = PrefixIndex(100), PrefixIndex(100)
    for index in (by_keys, by_tokens):
        index.add_engine("a", 4)
        index.add_engine("b", 8)
        index.apply_stored("a", [1, 2], None, tokens[:8], None, 0.0)
    prompt = by_keys.prepare(tokens, None)
    assert isinstance(prompt, PromptKeys)
    assert by_keys.match_keys(prompt, 1.0) == by_tokens.match(tokens, None, 1.0)
    assert by_keys.note_routed_keys("b", prompt, 1.0, 5.0) == 5
    assert by_tokens.note_routed("b", tokens, None, 1.0, 5.0) == 5
    assert by_keys.match_keys(prompt, 2.0) == by_tokens.match(tokens, None, 2.0)
    assert by_keys.match(tokens, None, 2.0)["b"].optimistic_tokens == 40


def test_radix_runs_without_numpy_and_gives_the_same_keys() -> None:
    """radix needs only the stdlib and xxhash: with numpy unimportable the keys are identical."""
    script = """
import random, sys
sys.modules["numpy"] = None  # any `import numpy` now raises ImportError
from radix import PrefixIndex
from radix.keys import HAVE_NUMPY, KeySpace, token_array
assert not HAVE_NUMPY
rng = random.Random(3)
space = KeySpace(random.Random(11))
tokens = [rng.randrange(150_000) for _ in range(16 * 300)]
print(space.chain(token_array(tokens), 16, space.root(16, None)))
index = PrefixIndex(max_blocks=1000)
index.add_engine("e", 16)
index.note_routed("e", tokens, None, 0.0, 10.0)
print(index.match(tokens, None, 1.0)["e"].optimistic_tokens)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parent.parent).stdout.split("\n")
    rng = random.Random(3)
    space = KeySpace(random.Random(11))
    tokens = [rng.randrange(150_000) for _ in range(16 * 300)]
    with_numpy = space.chain(token_array(tokens), 16, space.root(16, None))
    assert out[0] == str(with_numpy)
    assert out[1] == str(len(tokens))
