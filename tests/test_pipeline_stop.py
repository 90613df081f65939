"""Stop strings: held-back text, cuts across chunk boundaries, several stops, include_stop_str."""

from __future__ import annotations

import sys
from bisect import bisect_left

from hypothesis import given, settings
from hypothesis import strategies as st

from output.holdback import HoldBack, held_back
from output.stop import StopChecker


def _vllm_check(text: str, new: int, stops: list[str], include: bool) -> tuple[str, int] | None:
    """vLLM 0.33 check_stop_strings, restated: earliest completion wins, ties by list order."""
    if not new or not stops:
        return None
    best, best_idx, best_end = None, 0, sys.maxsize
    for s in stops:
        idx = text.find(s, 1 - new - len(s))
        if idx != -1 and idx + len(s) < best_end:
            best, best_idx, best_end = s, idx, idx + len(s)
    if best is None:
        return None
    if include:
        return best, (-1 if best_end >= len(text) else best_end)
    return best, best_idx


def _vllm_reference(batches: list[list[str]], stops: list[str], include: bool,
                    min_tokens: int) -> tuple[str, str | None, int]:
    """vLLM's detokenizer stop handling over whole batches: (final text, stop, tokens kept)."""
    text, num = "", 0
    for batch in batches:
        prev = num
        offsets = [len(text)]
        for piece in batch:
            text += piece
            offsets.append(len(text))
            num += 1
        if num > min_tokens:
            check_from = offsets[max(min_tokens - prev, 0)]
            hit = _vllm_check(text, len(text) - check_from, stops, include)
            if hit is not None:
                stop, trunc = hit
                end = len(text) if trunc == -1 else trunc
                if not include:
                    end += len(stop)
                kept = bisect_left(offsets, end, lo=1)
                if trunc != -1:
                    text = text[:trunc]
                return text, stop, prev + kept
    return text, None, num


def _longest_suffix_prefix(text: str, stops: list[str]) -> int:
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


pieces = st.text(alphabet="abc", max_size=4)
batches_st = st.lists(st.lists(pieces, min_size=1, max_size=4), min_size=1, max_size=8)
stops_st = st.lists(st.text(alphabet="abc", min_size=1, max_size=4), min_size=1, max_size=3)


@settings(max_examples=600, deadline=None)
@given(batches=batches_st, stops=stops_st, include=st.booleans(), min_tokens=st.integers(0, 6))
def test_matches_vllm_and_holds_back_minimally(
    batches: list[list[str]], stops: list[str], include: bool, min_tokens: int
) -> None:
    _check_against_vllm(batches, stops, include, min_tokens)


def _check_against_vllm(
    batches: list[list[str]], stops: list[str], include: bool, min_tokens: int
) -> None:
    want_text, want_stop, want_kept = _vllm_reference(batches, stops, include, min_tokens)
    checker = StopChecker(stops, include_in_output=include, min_tokens=min_tokens)
    released, seen, tokens = "", "", 0
    for batch in batches:
        # One-token batches take the per-token fast path, as the pipeline does.
        out, match = checker.push_one(batch[0]) if len(batch) == 1 else checker.push(batch)
        released += out
        seen += "".join(batch)
        if match is not None:
            assert match.stop == want_stop
            assert released == want_text
            assert tokens + match.num_tokens_kept == want_kept
            return
        tokens += len(batch)
        # Only what could still grow into a stop string is withheld.
        assert released == seen[: len(seen) - _longest_suffix_prefix(seen, stops)]
    released += checker.finish()
    assert want_stop is None
    assert released == want_text == seen
    assert tokens == want_kept


def test_stop_across_chunk_boundary_is_held_then_cut() -> None:
    c = StopChecker(["</end>"], include_in_output=False)
    assert c.push(["Hello </"]) == ("Hello ", None)  # "</" could start the stop: withheld
    text, match = c.push(["en", "d> tail"])
    assert text == "" and match is not None
    assert (match.stop, match.num_tokens_kept) == ("</end>", 2)


def test_false_alarm_is_released() -> None:
    c = StopChecker(["</end>"], include_in_output=False)
    assert c.push(["a </e"]) == ("a ", None)
    assert c.push(["x"]) == ("</ex", None)
    assert c.finish() == ""


def test_include_stop_str_and_earliest_of_several() -> None:
    c = StopChecker(["world", "lo w"], include_in_output=True)
    text, match = c.push(["hello world!"])
    # "lo w" completes before "world" does, so it wins although it is listed second.
    assert match is not None and match.stop == "lo w" and text == "hello w"
    c = StopChecker(["world", "lo w"], include_in_output=False)
    text, match = c.push(["hel", "lo", " world"])
    assert match is not None and match.stop == "lo w" and text == "hel"
    assert match.num_tokens_kept == 3


def test_min_tokens_protects_the_first_tokens() -> None:
    c = StopChecker(["x"], include_in_output=False, min_tokens=2)
    assert c.push(["ax"]) == ("ax", None)  # inside the first min_tokens tokens: ignored
    text, match = c.push(["b", "cxd"])
    assert match is not None and text == "bc" and match.num_tokens_kept == 2


def test_no_stops_passes_through() -> None:
    c = StopChecker([], include_in_output=False)
    assert not c.active
    assert c.push(["a", "b"]) == ("ab", None)
    c = StopChecker([""], include_in_output=False)  # empty stop strings are ignored
    assert not c.active


def _naive_held_back(text: str, markers: list[str]) -> int:
    return max((k for m in markers for k in range(1, min(len(m), len(text) + 1))
                if text.endswith(m[:k])), default=0)


def _adversarial(n: int) -> st.SearchStrategy[str]:
    """Long stop strings with long borders: the shapes that defeat a naive scan."""
    return st.sampled_from(["a" * n + "b", "ab" * n, "a" * n, "aab" * (n // 3) + "aac",
                            "abaabaab"[: n % 8 + 1] * (n // 8 + 1)])


long_stops_st = st.integers(2, 120).flatmap(
    lambda n: st.lists(st.one_of(_adversarial(n), st.text(alphabet="abc", min_size=1,
                                                          max_size=n)), min_size=1, max_size=4))
long_batches_st = st.lists(st.lists(st.text(alphabet="abc", max_size=40), min_size=1, max_size=4),
                           min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="ab", max_size=300), stops=long_stops_st)
def test_held_back_matches_naive(text: str, stops: list[str]) -> None:
    assert held_back(text, stops) == _naive_held_back(text, stops)
    hb = HoldBack(stops)
    # Streamed one character at a time, the tail handed in is what the last call held back.
    tail = ""
    for i, ch in enumerate(text):
        tail += ch
        k = hb.hold(tail, 1)
        assert k == _naive_held_back(text[: i + 1], stops)
        tail = tail[len(tail) - k:]
    assert len(tail) == _naive_held_back(text, stops)


@settings(max_examples=300, deadline=None)
@given(batches=long_batches_st, stops=long_stops_st, include=st.booleans(),
       min_tokens=st.integers(0, 6))
def test_long_adversarial_stops_match_vllm(
    batches: list[list[str]], stops: list[str], include: bool, min_tokens: int
) -> None:
    _check_against_vllm(batches, stops, include, min_tokens)


def test_stop_string_memory_is_linear() -> None:
    """A 200k-character stop string over as much text: a table of its prefixes would take ~20 GB."""
    import tracemalloc

    n = 200_000
    tracemalloc.start()
    try:
        c = StopChecker(["a" * n + "b"], include_in_output=False)
        released = ""
        for _ in range(n // 1000):
            out, match = c.push(["a" * 1000])
            assert match is None
            released += out
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert released == ""  # every "a" could still begin the stop
    text, match = c.push(["b"])
    assert match is not None and text == ""
    # Failure table (8 bytes an entry, n+2 entries) and the withheld text, with slack.
    assert peak < 64 * n
