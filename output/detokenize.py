"""Incremental detokenization of engine tokens: the text equals tokenizer.decode(all ids) exactly.

Two interchangeable implementations behind one factory, ``TokenDecoder``, built once per model:

- ``StreamDetokenizer`` wraps ``tokenizers.decoders.DecodeStream`` and works for every tokenizer.
  DecodeStream withholds text while the last tokens end in an incomplete UTF-8 sequence; at the
  end of a request ``flush()`` releases what ``decode()`` would show there (U+FFFD).
- ``ByteLevelDetokenizer`` is the fast path for byte-level BPE tokenizers (Qwen, Llama 3, GPT-2
  family, gpt-oss): there ``decode(ids)`` is by definition the lossy UTF-8 decoding of the
  concatenated token bytes, so a per-id bytes table and Python's incremental UTF-8 decoder give
  the same text for a fraction of the cost (measured in bench/router_pipeline.py). The property
  test in tests/test_pipeline_detokenize.py holds both to ``tokenizer.decode``.
"""

from __future__ import annotations

from codecs import utf_8_decode as _utf8_decode
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import msgspec
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from render.fast_bpe import byte_decoder

# DecodeStream needs a few tokens of context to know the leading-space and byte-merging state of
# the next token; vLLM seeds its detokenizer with the prompt tail for the same reason.
PROMPT_CONTEXT_TOKENS = 6
# Context re-decoded when flushing withheld bytes: enough for a 4-byte character plus a marker.
FLUSH_CONTEXT_TOKENS = 5


class Detokenizer(Protocol):
    def step(self, token_id: int) -> str:
        """Feed one token; return the newly decodable text ("" while bytes are incomplete)."""
        ...

    def flush(self) -> str:
        """End of the request: return text still withheld (incomplete UTF-8 shows as U+FFFD)."""
        ...


def _whole_text(data: bytes) -> str | None:
    """The text of bytes that decode alone exactly as inside any sequence, else None.

    Complete UTF-8 qualifies; bytes that are invalid or cut short depend on their neighbours
    (an incomplete character may be completed by the next token).
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


class StreamDetokenizer:
    """DecodeStream for any tokenizer, with an exact flush of withheld bytes."""

    __slots__ = ("_tok", "_stream", "_skip", "_ids", "_pending")

    def __init__(self, tok: Tokenizer, skip_special_tokens: bool, prompt_tail: Sequence[int]):
        self._tok = tok
        self._skip = skip_special_tokens
        tail = list(prompt_tail[-PROMPT_CONTEXT_TOKENS:])
        self._stream = DecodeStream(tail, skip_special_tokens=skip_special_tokens)
        self._ids: list[int] = tail
        self._pending = 0  # tokens fed since DecodeStream last returned text

    def step(self, token_id: int) -> str:
        self._ids.append(token_id)
        try:
            text = self._stream.step(self._tok, token_id)
        except Exception:  # tokenizers' DecodeStream gives up on some invalid byte-fallback runs
            self._pending += 1
            text = self.flush()
            self._stream = DecodeStream(self._ids[-PROMPT_CONTEXT_TOKENS:],
                                        skip_special_tokens=self._skip)
            return text
        if text is None:
            self._pending += 1
            return ""
        self._pending = 0
        return text

    def flush(self) -> str:
        if not self._pending:
            return ""
        ids = self._ids
        start = max(0, len(ids) - self._pending - FLUSH_CONTEXT_TOKENS)
        ctx = ids[start : len(ids) - self._pending]
        dec = self._tok.decode
        full = dec(ids[start:], skip_special_tokens=self._skip)
        before = dec(ctx, skip_special_tokens=self._skip)
        self._pending = 0
        return full[len(before) :] if full.startswith(before) else full


class ByteLevelDetokenizer:
    """Byte-level BPE: per token a table lookup; UTF-8 decoding only around split characters."""

    __slots__ = ("_table", "_text", "_held")

    def __init__(self, table: Sequence[bytes], text: Sequence[str | None]):
        self._table = table
        self._text = text  # the token's text when its bytes are complete UTF-8 on their own
        self._held = b""  # bytes of a character still incomplete

    def step(self, token_id: int) -> str:
        if not self._held:
            try:
                text = self._text[token_id]
            except IndexError:
                return ""  # tokenizers' decode skips ids outside the vocabulary
            if text is not None:
                return text
            data = self._table[token_id]
        else:
            data = self._held + (self._table[token_id] if token_id < len(self._table) else b"")
        text, used = _utf8_decode(data, "replace", False)
        self._held = data[used:]
        return text

    def flush(self) -> str:
        held, self._held = self._held, b""
        return held.decode("utf-8", "replace") if held else ""


class SkippingDetokenizer:
    """A detokenizer that never sees some tokens: the special tokens a client skips, but for
    those an output parser needs (decoding skips them as if absent, as skip_special_tokens
    does)."""

    __slots__ = ("_inner", "_drop")

    def __init__(self, inner: Detokenizer, drop: frozenset[int]) -> None:
        self._inner = inner
        self._drop = drop

    def step(self, token_id: int) -> str:
        if token_id in self._drop:
            return ""
        return self._inner.step(token_id)

    def flush(self) -> str:
        return self._inner.flush()


class TokenJSON(NamedTuple):
    """One token's parts of a chat logprob entry, exactly as msgspec encodes them:
    ``head + <logprob> + bytes_json`` then ``}`` (a candidate) or ``,"top_logprobs":[...]}``.
    ``head`` is None when the token's shown text depends on the preceding tokens: it alone
    decodes to a trailing U+FFFD and (byte-level BPE) its bytes could complete a character."""

    head: bytes | None  # {"token":"...","logprob":
    bytes_json: bytes  # ,"bytes":[...]


# Stands for a head that depends on the preceding tokens in ``TokenDecoder.head_table``: 0xFF
# never occurs in UTF-8, so JSON text that contains it was built from such a head.
CONTEXT_HEAD = b"\xff"


def token_head(text: str) -> bytes:
    return b'{"token":' + msgspec.json.encode(text) + b',"logprob":'


class TokenDecoder:
    """Per-model detokenization state shared by all requests: tables and per-id strings."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        added = tokenizer.get_added_tokens_decoder()
        self.special_ids = frozenset(i for i, t in added.items() if t.special)
        size = max(tokenizer.get_vocab_size(with_added_tokens=True), max(added, default=-1) + 1)
        self._raw: list[bytes] | None = None
        self._no_special: list[bytes] = []
        self._texts: list[str | None] = []
        self._texts_no_special: list[str | None] = []
        if type(tokenizer.decoder).__name__ == "ByteLevel":
            self._raw = raw = self._byte_table(size)
            self._no_special = [b"" if i in self.special_ids else b for i, b in enumerate(raw)]
            self._texts = [_whole_text(b) for b in raw]
            self._texts_no_special = [_whole_text(b) for b in self._no_special]
        self._text_cache: dict[int, str] = {}
        # Byte tables that skip the special tokens but some (parsers' markers), per kept set.
        self._kept: dict[frozenset[int], tuple[list[bytes], list[str | None]]] = {}
        # Per token id, filled on first use: the token's JSON fragments for logprobs, as
        # TokenJSON and again as two flat lists (whole engine messages are formatted by
        # ``operator.itemgetter`` over them; ``CONTEXT_HEAD`` marks a context-dependent head).
        self.json_table: list[TokenJSON | None] = [None] * size
        self.head_table: list[bytes | None] = [None] * size
        self.tail_table: list[bytes | None] = [None] * size

    def _byte_table(self, size: int) -> list[bytes]:
        # Mirrors tokenizers' ByteLevel decoder: a piece whose characters all stand for bytes
        # becomes those bytes, any other piece (e.g. an added token) its own UTF-8.
        byte_of = byte_decoder()
        table = [b""] * size
        for piece, i in self.tokenizer.get_vocab(with_added_tokens=True).items():
            try:
                table[i] = bytes([byte_of[c] for c in piece])
            except KeyError:
                table[i] = piece.encode()
        return table

    @property
    def byte_level(self) -> bool:
        return self._raw is not None

    @property
    def raw_table(self) -> Sequence[bytes] | None:
        """Byte-level BPE: each id's bytes (special tokens: their text's UTF-8); ``decode(ids,
        skip_special_tokens=False)`` is then their concatenation decoded lossily. Else None."""
        return self._raw

    def new(
        self,
        *,
        skip_special_tokens: bool = True,
        prompt_tail: Sequence[int] = (),
        fast: bool = True,
        keep: frozenset[int] = frozenset(),
    ) -> Detokenizer:
        """A detokenizer for one output sequence; ``fast=False`` forces DecodeStream.

        ``keep``: special tokens whose text stays even when skipping special tokens (an output
        parser's markers: the parser must see them whatever the client asked for)."""
        if skip_special_tokens and keep:
            return self._keeping(keep, prompt_tail, fast)
        if fast and self._raw is not None:
            if skip_special_tokens:
                return ByteLevelDetokenizer(self._no_special, self._texts_no_special)
            return ByteLevelDetokenizer(self._raw, self._texts)
        return StreamDetokenizer(self.tokenizer, skip_special_tokens, prompt_tail)

    def _keeping(self, keep: frozenset[int], prompt_tail: Sequence[int],
                 fast: bool) -> Detokenizer:
        if fast and self._raw is not None:
            tables = self._kept.get(keep)
            if tables is None:
                raw = self._raw
                data = [b"" if i in self.special_ids and i not in keep else b
                        for i, b in enumerate(raw)]
                tables = self._kept[keep] = (data, [_whole_text(b) for b in data])
            return ByteLevelDetokenizer(*tables)
        drop = self.special_ids - keep
        return SkippingDetokenizer(
            StreamDetokenizer(self.tokenizer, False,
                              [t for t in prompt_tail if t not in drop]), drop)

    def _decode_one(self, token_id: int) -> str:
        if self._raw is not None:
            raw = self._raw[token_id] if 0 <= token_id < len(self._raw) else b""
            return raw.decode("utf-8", "replace")
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        """One token decoded alone, as vLLM shows it in logprobs (``decode([id])``)."""
        text = self._text_cache.get(token_id)
        if text is None:
            text = self._text_cache[token_id] = self._decode_one(token_id)
        return text

    def token_json(self, token_id: int) -> TokenJSON:
        """The token's pre-encoded logprob JSON fragments, cached in ``json_table`` (~170 bytes
        per id: 26 MB if a run touches all of Qwen3's 151k ids)."""
        text = self._decode_one(token_id)
        head = None if text[-1:] == "\ufffd" else token_head(text)
        if head is None and self._raw is not None and 0 <= token_id < len(self._raw) and any(
                b & 0xC0 != 0x80 for b in self._raw[token_id]):
            # Byte-level and not all UTF-8 continuation bytes: from its first other byte on the
            # token decodes the same after any context (UTF-8 self-synchronises), so the text
            # with context still ends in U+FFFD and vLLM's correction shows "" whatever precedes.
            head = token_head("")
        info = TokenJSON(head, b',"bytes":' + msgspec.json.encode(list(self.token_bytes(token_id))))
        if 0 <= token_id < len(self.json_table):
            self.json_table[token_id] = info
            self.head_table[token_id] = CONTEXT_HEAD if head is None else head
            self.tail_table[token_id] = info.bytes_json
        return info

    def token_bytes(self, token_id: int) -> bytes:
        """The token's own bytes: for byte-level BPE the raw bytes (a partial UTF-8 character
        stays partial, so a client concatenating them recovers the exact text)."""
        if self._raw is not None and 0 <= token_id < len(self._raw):
            return self._raw[token_id]
        return self.token_text(token_id).encode()
