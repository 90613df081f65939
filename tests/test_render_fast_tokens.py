"""fastokens, where render encodes with it, equals HF tokenizers on any text, cached or not."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from render import fast_tokens
from tests.corpus import completion_prompts

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(os.environ.get("KVROUTE_CACHE", Path.home() / ".cache/kvroute")) / "fixtures"
QWEN3 = ROOT / "render/models/qwen3/tokenizer.json"


@functools.cache
def load(path: Path, cache_bytes: int) -> tuple[tokenizers.Tokenizer, fast_tokens.FastTokens]:
    tok = tokenizers.Tokenizer.from_file(str(path))
    fast = fast_tokens.build(path, tok, cache_bytes)
    assert fast is not None, f"fastokens must verify on {path.parent.name}"
    return tok, fast


def hf(tok: tokenizers.Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


_ADDED = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>", "<think>",
          "</think>", "<|im_start", "im_end|>", "<|", "|>"]
_chars = st.one_of(
    st.characters(codec="utf-8"),
    st.sampled_from(list(" \t\n\r\u00a0'sStTmMdD0123456789.,!?-_\u0301\u200d你好é🚀")),
)
# Text with added tokens and their fragments in it: the segmenting is what a cache could get wrong.
_texts = st.lists(st.one_of(st.text(_chars, max_size=40), st.sampled_from(_ADDED)), max_size=12)


@settings(max_examples=600, deadline=None)
@given(parts=_texts)
def test_equals_hf_on_random_text_with_added_tokens(parts: list[str]) -> None:
    text = "".join(parts)
    for cache_bytes in (0, 1 << 20):
        tok, fast = load(QWEN3, cache_bytes)
        assert fast.encode(text) == hf(tok, text)
        assert fast.encode(text) == hf(tok, text)  # again, from the segment cache


def test_segment_cache_serves_resent_history() -> None:
    tok, fast = load(QWEN3, 1 << 20)
    turns = [f"<|im_start|>user\nquestion {i} about café 你好<|im_end|>\n" for i in range(8)]
    before = fast.cache_stats()["hits"]
    for n in range(1, len(turns) + 1):
        text = "".join(turns[:n])
        assert fast.encode(text) == hf(tok, text)
    # Turn n resends n-1 earlier turns, each cut into the same segments between added tokens.
    assert fast.cache_stats()["hits"] - before >= len(turns) * (len(turns) - 1) // 2


def test_zero_budget_turns_the_cache_off() -> None:
    _, fast = load(QWEN3, 0)
    fast.encode("<|im_start|>hello<|im_end|>")
    assert fast.cache_stats() == {}


@pytest.mark.families
@pytest.mark.parametrize("family", ["qwen2_5", "llama3_1", "deepseek_v3_1", "gemma3"])
def test_equals_hf_on_every_family(family: str) -> None:
    path = FIXTURES / family / "tokenizer.json"
    if not path.exists():
        pytest.skip("run scripts/fixtures.sh")
    tok, fast = load(path, 1 << 20)
    added = [t.content for t in tok.get_added_tokens_decoder().values()]
    texts = completion_prompts() + [" ".join(added[:200]), "".join(added[-200:])]
    for _ in range(2):
        assert [fast.encode(t) for t in texts] == [hf(tok, t) for t in texts]
