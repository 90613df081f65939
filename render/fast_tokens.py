"""fastokens (the Rust tokenizer vllm-rs itself uses) as render's encoder, where it equals HF's.

fastokens reads the same tokenizer.json as Hugging Face ``tokenizers`` and returns the same ids
for a fraction of the CPU per token (bench/render_lib.py compares it with the tiktoken piece path
and ``tokenizers``), with a byte-bounded cache of the segments between added tokens in Rust
(resent chat history costs a hash lookup). It is used only after it
reproduced ``tokenizers`` on probe texts that cut through every added token, both with and without
its cache; anything else (not installed, a tokenizer it refuses or disagrees on) returns None and
the caller keeps the piece-cache path (render/piece_cache.py). The HF tokenizer stays the one that
decodes and reports offsets: fastokens is only the ``text -> ids`` of ``add_special_tokens=False``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import tokenizers

from render.fast_bpe import PROBES
from render.token_json import TokenArray, from_buffer

# Plain text around added tokens: what a chat template produces (and its look-alikes in user text).
_GLUE = ("", " ", "\n", "x", "  ", "\n\n", ":", "你", "\u2581", "<", "|>")


def _probe_texts(hf: tokenizers.Tokenizer) -> list[str]:
    """The regex probes, then every added token (special or not) cut into surrounding text."""
    added = sorted(t.content for t in hf.get_added_tokens_decoder().values())
    rng = random.Random(0)
    texts = list(PROBES)
    # Chunks of ~64 added tokens keep a 6k-token added vocabulary (Gemma 3) to ~100 texts.
    for start in range(0, len(added), 64):
        chunk = added[start : start + 64]
        texts.append("".join(rng.choice(_GLUE) + tok + rng.choice(PROBES)[:12] for tok in chunk))
        # Look-alikes: each token missing its last character must be tokenized as plain text.
        texts.append(" ".join(tok[:-1] for tok in chunk if len(tok) > 1))
    return texts


class FastTokens:
    """``encode(text)`` equal to ``tokenizer.encode(text, add_special_tokens=False).ids``."""

    def __init__(self, native: Any, cache_bytes: int) -> None:
        self._native = native
        self.cache_bytes = cache_bytes
        # Explicit budget (0 = off): the FASTOKENS_SEGMENT_CACHE variable must not decide it.
        native.enable_segment_cache(cache_bytes)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._native.encode(text, add_special_tokens=False).ids
        return ids

    def encode_array(self, text: str) -> TokenArray:
        """``encode`` as a uint32 array, with no Python int per token (render.token_json)."""
        ids, _ = self._native.encode_batch_flat([text], add_special_tokens=False)
        return from_buffer(ids)

    def cache_stats(self) -> dict[str, int]:
        """Segment-cache counters (hits, misses, entries, bytes, ...); empty when it is off."""
        stats = self._native.segment_cache_stats()
        return dict(stats) if stats else {}


def build(
    tokenizer_file: Path, hf: tokenizers.Tokenizer, cache_bytes: int
) -> FastTokens | None:
    """A verified fastokens encoder for this tokenizer.json, or None when it cannot be used."""
    try:
        import fastokens
    except ImportError:
        return None
    try:
        native = fastokens.Tokenizer.from_file(str(tokenizer_file))
    except Exception:  # a tokenizer.json fastokens does not support: the HF path serves it
        return None
    texts = _probe_texts(hf)
    reference = [e.ids for e in hf.encode_batch_fast(texts, add_special_tokens=False)]
    fast = FastTokens(native, cache_bytes)
    # Twice: the second pass goes through the segment cache the first one filled.
    for _ in range(2 if cache_bytes > 0 else 1):
        if [fast.encode(t) for t in texts] != reference:
            return None
        if [fast.encode_array(t).tolist() for t in texts] != reference:
            return None
    return fast
