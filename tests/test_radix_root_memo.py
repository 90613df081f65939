"""KeySpace.root's memo: the same roots as a fresh computation, before and after it empties."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from radix.keys import ROOT_MEMO, KeySpace

namespaces = st.one_of(st.none(), st.text(max_size=8),
                       st.tuples(st.one_of(st.none(), st.text(max_size=4)),
                                 st.one_of(st.none(), st.text(max_size=4))))


@given(st.lists(st.tuples(st.sampled_from([1, 16, 32]), namespaces), max_size=40))
def test_memoised_roots_equal_fresh_ones(pairs: list[tuple[int, object]]) -> None:
    memo = KeySpace(random.Random(7))
    for size, ns in pairs + pairs:  # the second pass reads the memo
        fresh = KeySpace(random.Random(7))  # same secrets, empty memo
        assert memo.root(size, ns) == fresh.root(size, ns)


def test_memo_is_bounded_and_roots_survive_its_emptying() -> None:
    space, twin = KeySpace(random.Random(3)), KeySpace(random.Random(3))
    first = space.root(16, ("lora", "salt-0"))
    for i in range(ROOT_MEMO * 2 + 5):  # client-chosen salts: unbounded namespaces
        space.root(16, (None, f"salt-{i}"))
        assert len(space._roots) <= ROOT_MEMO
    assert space.root(16, ("lora", "salt-0")) == first == twin.root(16, ("lora", "salt-0"))
    assert space.root(16, None) != space.root(32, None)
