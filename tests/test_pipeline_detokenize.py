"""Incremental detokenization equals tokenizer.decode of all engine tokens (Qwen3 tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from output.detokenize import TokenDecoder

QWEN3 = Path(__file__).resolve().parent.parent / "render" / "models" / "qwen3" / "tokenizer.json"


@pytest.fixture(scope="module")
def decoder() -> TokenDecoder:
    return TokenDecoder(Tokenizer.from_file(str(QWEN3)))


def _byte_ids(td: TokenDecoder) -> list[int]:
    """Tokens that are a single non-ASCII byte: the ones that split UTF-8 characters."""
    size = td.tokenizer.get_vocab_size(with_added_tokens=True)
    return [i for i in range(size) if len(b := td.token_bytes(i)) == 1 and b[0] >= 0x80]


def _id_lists(td: TokenDecoder) -> st.SearchStrategy[list[int]]:
    size = td.tokenizer.get_vocab_size(with_added_tokens=True)
    byte_ids = _byte_ids(td)
    special = sorted(td.special_ids)
    one = st.one_of(
        st.integers(0, size + 8),  # a few ids beyond the vocabulary too
        st.sampled_from(byte_ids),
        st.sampled_from(special),
    )
    encoded = st.text(max_size=40).map(lambda s: td.tokenizer.encode(s).ids)
    return st.lists(st.one_of(one.map(lambda i: [i]), encoded), max_size=12).map(
        lambda parts: [i for p in parts for i in p]
    )


def _run(td: TokenDecoder, ids: list[int], skip: bool, fast: bool) -> str:
    d = td.new(skip_special_tokens=skip, fast=fast)
    return "".join(d.step(i) for i in ids) + d.flush()


@pytest.mark.parametrize("fast", [True, False], ids=["byte-level", "DecodeStream"])
def test_equals_full_decode(decoder: TokenDecoder, fast: bool) -> None:
    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
    @given(ids=_id_lists(decoder), skip=st.booleans())
    def check(ids: list[int], skip: bool) -> None:
        assert _run(decoder, ids, skip, fast) == decoder.tokenizer.decode(
            ids, skip_special_tokens=skip)

    check()


def test_split_character_is_withheld_then_completed(decoder: TokenDecoder) -> None:
    ids = decoder.tokenizer.encode("日").ids
    assert len(ids) > 1 or len(decoder.token_bytes(ids[0])) == 3
    # Feed a 3-byte character one byte token at a time: nothing, nothing, then the character.
    byte_tok = {decoder.token_bytes(i): i for i in _byte_ids(decoder)}
    seq = [byte_tok[bytes([b])] for b in "日".encode()]
    for fast in (True, False):
        d = decoder.new(fast=fast)
        assert [d.step(i) for i in seq] == ["", "", "日"]
        assert d.flush() == ""
        d = decoder.new(fast=fast)
        assert [d.step(i) for i in seq[:2]] == ["", ""]
        # Cut short: decode() shows the incomplete character as U+FFFD, and so does flush.
        assert d.flush() == decoder.tokenizer.decode(seq[:2]) == "\ufffd"


def test_special_tokens(decoder: TokenDecoder) -> None:
    im_end = decoder.tokenizer.token_to_id("<|im_end|>")
    assert im_end in decoder.special_ids
    for fast in (True, False):
        assert _run(decoder, [im_end], True, fast) == ""
        assert _run(decoder, [im_end], False, fast) == "<|im_end|>"
    assert decoder.token_text(im_end) == "<|im_end|>"


def test_token_strings_match_single_decode(decoder: TokenDecoder) -> None:
    tok = decoder.tokenizer
    size = tok.get_vocab_size(with_added_tokens=True)
    for i in range(0, size, 97):
        assert decoder.token_text(i) == tok.decode([i], skip_special_tokens=False)
    # The bytes of a sequence's tokens concatenate to exactly its UTF-8 text.
    ids = tok.encode("naïve café – 日本語 🎉").ids
    assert b"".join(decoder.token_bytes(i) for i in ids).decode() == tok.decode(ids)
