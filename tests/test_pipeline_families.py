"""Detokenization over every fixture tokenizer family (byte-level BPE and SentencePiece-style)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from output.detokenize import TokenDecoder

FIXTURES = Path(os.environ.get("KVROUTE_CACHE", Path.home() / ".cache/kvroute")) / "fixtures"
FAMILIES = ["deepseek_v3_1", "gemma3", "gpt_oss", "llama3_1", "mistral_nemo", "qwen2_5"]

pytestmark = pytest.mark.families


def _decoder(family: str) -> TokenDecoder:
    path = FIXTURES / family / "tokenizer.json"
    if not path.exists():
        pytest.fail(f"{path} missing: run `bash scripts/fixtures.sh` (or deselect -m families)")
    return TokenDecoder(Tokenizer.from_file(str(path)))


@pytest.mark.parametrize("family", FAMILIES)
def test_incremental_text_equals_decode(family: str) -> None:
    td = _decoder(family)
    tok = td.tokenizer
    size = tok.get_vocab_size(with_added_tokens=True)
    ids_st = st.lists(st.one_of(
        st.integers(0, size - 1).map(lambda i: [i]),
        st.text(max_size=30).map(lambda s: tok.encode(s, add_special_tokens=False).ids),
    ), max_size=10).map(lambda parts: [i for p in parts for i in p])

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(ids=ids_st, skip=st.booleans(), tail=st.lists(st.integers(0, size - 1), max_size=4))
    def check(ids: list[int], skip: bool, tail: list[int]) -> None:
        whole_ids = tok.decode(ids, skip_special_tokens=skip)
        for fast in (True, False):
            d = td.new(skip_special_tokens=skip, fast=fast)
            text = "".join(d.step(i) for i in ids) + d.flush()
            # Byte-fallback decoders (Gemma) replace a whole run of byte tokens that is not UTF-8
            # as one unit, so a stream that already sent a valid leading byte cannot take it
            # back: exactness holds for text, and a stream over invalid bytes must not break.
            if "\ufffd" not in whole_ids:
                assert text == whole_ids
        # Seeded with the prompt's tail (as vLLM seeds its detokenizer), the text is what the
        # tail plus the output decode to, after the tail's own text: for SentencePiece-style
        # decoders this keeps the first output token's leading space.
        d = td.new(skip_special_tokens=skip, prompt_tail=tail, fast=False)
        text = "".join(d.step(i) for i in ids) + d.flush()
        whole = tok.decode(tail + ids, skip_special_tokens=skip)
        head = tok.decode(tail, skip_special_tokens=skip)
        # The same byte-fallback caveat as above: a run of byte tokens that is not UTF-8 as a
        # whole (e.g. 0x19 then a stray continuation byte) decodes to U+FFFD per byte, while
        # the stream already sent the valid leading byte.
        tail_ok = not head.endswith("\ufffd") and "\ufffd" not in whole[len(head):]
        if whole.startswith(head) and tail_ok:
            assert text == whole[len(head):]

    check()


@pytest.mark.parametrize("family", [f for f in FAMILIES if f == "gemma3"])
def test_invalid_byte_fallback_runs_do_not_break_the_stream(family: str) -> None:
    # Found by hypothesis: tokenizers' DecodeStream raises "Invalid prefix" on these Gemma ids.
    td = _decoder(family)
    for ids in ([245, 366, 0], [245, 366]):
        d = td.new(skip_special_tokens=False, fast=False)
        text = "".join(d.step(i) for i in ids) + d.flush()
        assert text.replace("\x07", "") == td.tokenizer.decode(ids, skip_special_tokens=False)
