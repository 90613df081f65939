"""The tiktoken fast path equals Hugging Face's BPE on any text without added tokens."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from render import fast_bpe
from tests.corpus import FAMILIES, completion_prompts, conversations

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(os.environ.get("KVROUTE_CACHE", Path.home() / ".cache/kvroute")) / "fixtures"


@functools.cache
def qwen3() -> tuple[tokenizers.Tokenizer, Callable[[Sequence[str]], list[list[int]]]]:
    tok = tokenizers.Tokenizer.from_file(str(ROOT / "render/models/qwen3/tokenizer.json"))
    fast = fast_bpe.build(tok)
    assert fast is not None, "Qwen3 is rank-ordered byte-level BPE: the fast path must apply"
    return tok, fast


def hf(tok: tokenizers.Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


_chars = st.one_of(
    st.characters(codec="utf-8"),
    st.sampled_from(list(" \t\n\r\u00a0'sStTmMdD0123456789.,!?-_\u0301\u200d你好é🚀")),
)


@settings(max_examples=800, deadline=None)
@given(text=st.text(_chars, max_size=80))
def test_fast_bpe_equals_hf_on_random_text(text: str) -> None:
    tok, fast = qwen3()
    if any(t.content in text for t in tok.get_added_tokens_decoder().values()):
        return  # the piece cache cuts added tokens out before encoding
    assert fast([text])[0] == hf(tok, text)


def test_fast_bpe_equals_hf_on_the_corpus() -> None:
    tok, fast = qwen3()
    added = [t.content for t in tok.get_added_tokens_decoder().values()]
    texts = [p for p in completion_prompts() if p and not any(a in p for a in added)]
    for family in FAMILIES:
        for _, case in conversations(family):
            for m in case["messages"]:
                c = m.get("content")
                parts = [c] if isinstance(c, str) else [
                    p if isinstance(p, str) else p.get("text", "") for p in c or []]
                texts += [p for p in parts if p and not any(a in p for a in added)]
    assert len(texts) > 100
    assert fast(texts) == [hf(tok, t) for t in texts]


def test_tokenizers_it_cannot_match_are_refused() -> None:
    # Word-level (not BPE) and a BPE whose merges break rank order both fall back to HF.
    word = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "[UNK]": 1}, "[UNK]"))
    assert fast_bpe.build(word) is None
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(
        {"a": 0, "b": 1, "ab": 3, "ba": 2}, [("a", "b"), ("b", "a")]))
    assert fast_bpe.build(bpe) is None


@pytest.mark.families
@pytest.mark.parametrize("family", ["qwen2_5", "llama3_1", "gpt_oss", "deepseek_v3_1", "gemma3"])
def test_fast_path_applies_only_where_exact(family: str) -> None:
    path = FIXTURES / family / "tokenizer.json"
    if not path.exists():
        pytest.fail("run scripts/fixtures.sh")
    tok = tokenizers.Tokenizer.from_file(str(path))
    fast = fast_bpe.build(tok)
    if fast is None:
        return  # refused: the Hugging Face path is used
    added = [t.content for t in tok.get_added_tokens_decoder().values()]
    texts = [p for p in completion_prompts() if p and not any(a in p for a in added)]
    assert fast(texts) == [hf(tok, t) for t in texts]
