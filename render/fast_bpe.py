"""A faster exact encoder for byte-level BPE tokenizers whose merges follow token ranks (tiktoken).

Hugging Face's BPE applies merges by merge-list priority; tiktoken merges the adjacent pair whose
concatenation has the lowest rank. The two agree when the tokenizer came from a rank-ordered BPE
(Qwen2/3, Llama 3, gpt-oss): every merge's result has a larger id than the merges before it. We
build a tiktoken ``Encoding`` only for tokenizers of exactly that shape — one regex Split then
ByteLevel without its own regex, a NFC or no normalizer, rank-ordered merges — and then prove it on
a sample before use; anything else returns None and the caller keeps the Hugging Face path.
tiktoken releases the GIL while it encodes and costs several times less per token than
``encode_batch_fast`` (bench/render_lib.py compares them). Input must be free of added tokens
(the piece cache cuts them out first), as tiktoken's ``encode_ordinary`` knows no special tokens.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import tokenizers

# Text that exercises the regex branches (contractions, digits, punctuation runs, newlines,
# whitespace before non-space, CJK, emoji, combining marks) for the self-check.
PROBES = (
    "Hello world! It's 2024; we'll see—I'd say 1234567 items, they're OK.\n\n  indented\ttab",
    "你好，世界！今日は良い天気ですね。안녕하세요 🌏🚀😀 👨‍👩‍👧‍👦 — ok?",
    "café naïve résumé e\u0301 Ω≈ç√ ﬁ ½ ¼ x²",
    "def f(x):\n    return x ** 2  # comment\r\n\r\n\n   \n{'a': [1, 2]}",
    "   leading and trailing spaces   ",
    "CAPS'S DON'T WON'T I'M YOU'RE THEY'VE WE'LL HE'D",
    "\u00a0nbsp\u2003em\u200bzero-width\ufeffbom",
    "x" * 300 + " " + "ab" * 200,
)


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: the byte each printable stand-in character means."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
          *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _split_pattern(pre: dict[str, Any] | None) -> str | None:
    """The regex of a ``Sequence[Split(Regex, Isolated), ByteLevel(use_regex=False)]``."""
    if not pre or pre.get("type") != "Sequence":
        return None
    steps = pre.get("pretokenizers") or []
    if len(steps) != 2:
        return None
    split, byte_level = steps
    if split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert"):
        return None
    if byte_level.get("type") != "ByteLevel" or byte_level.get("use_regex") or \
            byte_level.get("add_prefix_space"):
        return None
    regex = (split.get("pattern") or {}).get("Regex")
    return regex if isinstance(regex, str) else None


def build(tok: tokenizers.Tokenizer) -> Callable[[Sequence[str]], list[list[int]]] | None:
    """An exact ``pieces -> ids`` encoder for ``tok``, or None when tiktoken cannot match it."""
    try:
        import tiktoken
    except ImportError:
        return None
    # Cheap checks on the live objects first: the full JSON (vocab, merges) is parsed only for
    # tokenizers that can qualify.
    bpe = tok.model
    if not isinstance(bpe, tokenizers.models.BPE) or bpe.dropout or bpe.byte_fallback or \
            bpe.continuing_subword_prefix or bpe.end_of_word_suffix or bpe.ignore_merges:
        return None
    normalizer = json.loads(tok.normalizer.__getstate__()) if tok.normalizer else None
    if normalizer is not None and normalizer.get("type") != "NFC":
        return None
    pre = json.loads(tok.pre_tokenizer.__getstate__()) if tok.pre_tokenizer else None
    pattern = _split_pattern(pre)
    if pattern is None:
        return None
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    merges = [m.split(" ", 1) if isinstance(m, str) else m for m in model.get("merges", [])]
    last = -1
    merged = set()
    for a, b in merges:  # rank order == merge order, or tiktoken would merge differently
        rank = vocab.get(a + b)
        if rank is None or rank <= last:
            return None
        last = rank
        merged.add(a + b)
    # tiktoken forms any token whose two parts meet; BPE only those a merge produces.
    if any(len(token) > 1 and token not in merged for token in vocab):
        return None
    decoder = byte_decoder()
    try:
        ranks = {bytes(decoder[ch] for ch in token): i for token, i in vocab.items()}
        enc = tiktoken.Encoding("kvroute-fast-bpe", pat_str=pattern, mergeable_ranks=ranks,
                                special_tokens={})
    except (KeyError, ValueError):
        return None
    nfc = normalizer is not None

    def encode(pieces: Sequence[str]) -> list[list[int]]:
        out = []
        for p in pieces:
            if nfc and not unicodedata.is_normalized("NFC", p):
                p = unicodedata.normalize("NFC", p)
            out.append(enc.encode_ordinary(p))
        return out

    reference = [e.ids for e in tok.encode_batch_fast(list(PROBES), add_special_tokens=False)]
    return encode if encode(PROBES) == reference else None
