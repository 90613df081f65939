"""Exact tokenization caching the pieces between added tokens (resent chat history is ~free).

Hugging Face tokenizers first cut the input on every added token (special or not), then normalize,
pre-tokenize and BPE each remaining piece on its own. So ``ids(text)`` is the concatenation of
``ids(piece)`` for the pieces and the added tokens' own ids, and a piece's ids never depend on its
neighbours. We cut the text the same way (leftmost-longest match, like the tokenizer's Aho-Corasick
automaton), look each piece up in a byte-bounded LRU, and send only the misses to the tokenizer in
one batch. When the tokenizer's configuration makes that cut differ from what the tokenizer does
(added tokens with lstrip/rstrip/single_word, added tokens matched after a non-trivial normalizer,
a Metaspace pre-tokenizer that prepends only at the start of the text) we always use the plain
path.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any

import msgspec
import tokenizers

from render import fast_bpe

# Pieces this long or longer are tokenized but not cached: one-off long documents would evict the
# short, often repeated pieces (system prompts, tool schemas, earlier turns) that make it pay.
_MAX_CACHED_PIECE = 1 << 20


class TokenizerSpec(msgspec.Struct):
    """The parts of tokenizer.json that decide whether the cut is safe (the vocab is skipped)."""

    added_tokens: list[dict[str, Any]] = msgspec.field(default_factory=list)
    normalizer: dict[str, Any] | None = None
    pre_tokenizer: dict[str, Any] | None = None


def read_spec(tok_json: bytes | str) -> dict[str, Any]:
    spec = msgspec.json.decode(tok_json, type=TokenizerSpec)
    return msgspec.structs.asdict(spec)


def unsafe_reason(tok: tokenizers.Tokenizer, spec: dict[str, Any] | None = None) -> str | None:
    """Why cutting on added tokens could differ from the tokenizer's own cut (None: it can't)."""
    if spec is None:
        spec = read_spec(tok.to_str())
    normalizer = spec.get("normalizer")
    trivial_norm = normalizer is None or (
        normalizer.get("type") == "Sequence" and not normalizer.get("normalizers")
    )
    for added in spec.get("added_tokens", []):
        if added.get("lstrip") or added.get("rstrip") or added.get("single_word"):
            return f"added token {added['content']!r} has lstrip/rstrip/single_word"
        if added.get("normalized") and not trivial_norm:
            return f"added token {added['content']!r} is matched after normalization"
    if _has_first_only_metaspace(spec.get("pre_tokenizer")):
        return "Metaspace pre-tokenizer prepends only at the start of the text"
    return None


def _has_first_only_metaspace(node: object) -> bool:
    if isinstance(node, dict):
        if node.get("type") == "Metaspace" and node.get("prepend_scheme") == "first":
            return True
        return any(_has_first_only_metaspace(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_first_only_metaspace(v) for v in node)
    return False


class PieceCache:
    """``encode(text)`` equal to ``tokenizer.encode(text, add_special_tokens=False).ids``."""

    def __init__(
        self,
        tok: tokenizers.Tokenizer,
        max_bytes: int = 64 << 20,
        spec: dict[str, Any] | None = None,
        tiktoken: bool = True,
    ) -> None:
        self._tok = tok
        self.max_bytes = max_bytes
        self.unsafe = unsafe_reason(tok, spec)
        added = tok.get_added_tokens_decoder()
        self._added_ids = {t.content: i for i, t in added.items()}
        contents = sorted(self._added_ids, key=len, reverse=True)
        # Longest first makes Python's leftmost-first alternation pick the leftmost-longest match.
        self._split_re = re.compile("|".join(map(re.escape, contents))) if contents else None
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._bytes = 0
        # tiktoken, when it provably matches this tokenizer: cheaper on the misses
        # (render/fast_bpe.py). Not built when the caller encodes with fastokens: its ranks
        # would be unused memory.
        self._fast = fast_bpe.build(tok) if self.unsafe is None and tiktoken else None
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.unsafe is None and self.max_bytes > 0

    def cached_bytes(self) -> int:
        return self._bytes

    def clear(self) -> None:
        self._cache.clear()
        self._bytes = 0

    def split(self, text: str) -> list[str | int]:
        """The text cut the tokenizer's way: strings for pieces, ints for added tokens' ids."""
        out: list[str | int] = []
        if self._split_re is None:
            return [text] if text else []
        pos = 0
        ids = self._added_ids
        for m in self._split_re.finditer(text):
            start = m.start()
            if start > pos:
                out.append(text[pos:start])
            out.append(ids[m.group()])
            pos = m.end()
        if pos < len(text):
            out.append(text[pos:])
        return out

    def encode(self, text: str) -> list[int]:
        if not self.enabled:
            # encode_batch_fast skips offset tracking: cheaper than encode(), same ids.
            return self._tok.encode_batch_fast([text], add_special_tokens=False)[0].ids
        parts = self.split(text)
        cache = self._cache
        # dict, not set: keeps first-seen order so results zip back to their pieces.
        missing: dict[str, None] = {}
        for p in parts:
            if type(p) is str and p not in cache:
                missing[p] = None
        fresh: dict[str, list[int]] = {}
        if missing:
            self.misses += len(missing)
            if self._fast is not None:
                for piece, piece_ids in zip(missing, self._fast(list(missing)), strict=True):
                    fresh[piece] = piece_ids
            else:
                encs = self._tok.encode_batch_fast(list(missing), add_special_tokens=False)
                for piece, enc in zip(missing, encs, strict=True):
                    fresh[piece] = enc.ids
        out: list[int] = []
        for p in parts:
            if type(p) is int:
                out.append(p)
                continue
            assert isinstance(p, str)
            ids = fresh.get(p)
            if ids is None:
                ids = cache[p]
                cache.move_to_end(p)
                self.hits += 1
            out.extend(ids)
        for piece, ids in fresh.items():
            self._store(piece, ids)
        return out

    def _store(self, piece: str, ids: list[int]) -> None:
        size = len(piece) + 8 * len(ids)
        if size >= _MAX_CACHED_PIECE or size > self.max_bytes:
            return
        self._cache[piece] = ids
        self._bytes += size
        while self._bytes > self.max_bytes:
            old, old_ids = self._cache.popitem(last=False)
            self._bytes -= len(old) + 8 * len(old_ids)
