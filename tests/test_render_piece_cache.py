"""The piece cache equals the tokenizer on any text, keeps its byte bound, knows when not to cut."""

from __future__ import annotations

from functools import cache

import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken

from render import Renderer
from render.piece_cache import PieceCache


@cache
def qwen3() -> Renderer:
    return Renderer.load()


def qwen3_tokenizer() -> tokenizers.Tokenizer:
    return qwen3().tokenizer


@cache
def _caches(max_bytes: int) -> PieceCache:
    return PieceCache(qwen3_tokenizer(), max_bytes, qwen3().files.tokenizer_spec)


def cache_for(max_bytes: int = 64 << 20) -> PieceCache:
    """An emptied cache (built once per budget: building one compiles the fast BPE encoder)."""
    pc = _caches(max_bytes)
    pc.clear()
    pc.hits = pc.misses = 0
    return pc


ADDED = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>", "<tool_call>"]
# Fragments that straddle added tokens and whitespace/Unicode edge cases.
FRAGMENTS = ADDED + [
    "<|im_",
    "start|>",
    "<",
    "|>",
    " ",
    "  ",
    "\n",
    "\n\n",
    "user",
    "assistant",
    "Hello",
    " world",
    "你好",
    "😀",
    "e\u0301",
    "123",
    "'s",
    "\t",
]
TEXT = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=6)), max_size=25).map(
    "".join
)


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(TEXT, min_size=1, max_size=4))
def test_cached_encoding_equals_tokenizer(texts: list[str]) -> None:
    tok = qwen3_tokenizer()
    pc = cache_for(4096)
    assert pc.enabled
    for _ in range(2):  # cold, then warm
        for text in texts:
            assert pc.encode(text) == tok.encode(text, add_special_tokens=False).ids
            assert pc.cached_bytes() <= 4096


def test_lru_evicts_oldest_within_budget() -> None:
    pc = cache_for(600)
    texts = [f"piece number {i} " * 5 for i in range(40)]
    for t in texts:
        pc.encode(t)
    assert 0 < pc.cached_bytes() <= 600
    pc.encode(texts[-1])
    assert pc.hits >= 1
    before = pc.misses
    pc.encode(texts[0])  # long evicted
    assert pc.misses == before + 1


def test_resent_history_only_tokenizes_what_is_new() -> None:
    tok = qwen3_tokenizer()
    pc = cache_for()
    history = "<|im_start|>system\nBe brief.<|im_end|>\n"
    for turn in range(6):
        history += f"<|im_start|>user\nquestion {turn}<|im_end|>\n<|im_start|>assistant\n"
        before = pc.misses
        assert pc.encode(history) == tok.encode(history, add_special_tokens=False).ids
        if turn:  # only the new answer and the new question are tokenized
            assert pc.misses - before == 2
        history += f"answer {turn}<|im_end|>\n"


def _toy(added: AddedToken) -> tokenizers.Tokenizer:
    from tokenizers import models, pre_tokenizers

    tok = tokenizers.Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([added])
    return tok


def test_unsafe_added_tokens_fall_back_to_the_plain_path() -> None:
    for flag in ("lstrip", "rstrip", "single_word"):
        tok = _toy(AddedToken("<X>", special=True, **{flag: True}))
        pc = PieceCache(tok)
        assert not pc.enabled and pc.unsafe is not None and flag in pc.unsafe
        for text in ("a <X> b", "a<X>b", " <X> "):
            assert pc.encode(text) == tok.encode(text, add_special_tokens=False).ids
    safe = PieceCache(_toy(AddedToken("<X>", special=True, normalized=False)))
    assert safe.enabled


def test_zero_budget_disables_caching() -> None:
    pc = cache_for(0)
    assert not pc.enabled
    assert pc.encode("hi <|im_end|>") == qwen3_tokenizer().encode("hi <|im_end|>").ids
