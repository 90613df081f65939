"""Deterministic "model" of the sim engine: which token ids it may emit and which one comes next.

Output ids are drawn from a table of ordinary, decodable vocabulary entries (for a tokenizer:
ASCII words, so detokenized text reads as words; otherwise every id below ``vocab_size`` that
is not special), by a splitmix64 hash of (request key, position). The key follows vLLM's
sampling semantics: greedy (temperature 0) and seeded requests depend on the prompt only, so
identical requests give identical outputs; unseeded sampling differs per request id.

``markov`` output is a toy autoregressive model instead: each id is a hash of the ids before it
(the last ``MARKOV_ORDER``), so it is a function of the sequence so far, as a real model's
greedy choice is: a request continued from any point of its own output (the router's resume
after an engine died) gives the same ids as the unbroken one. Greedy requests hash the context
alone; seeded ones the seed and the output position too (vLLM's seeded generator advances per
step, so a resumed request samples afresh from the seam), unseeded ones the request id.

With a tokenizer the default output is an echo instead (``echo_ids``): the prompt's last line of
text after a "(simulated)" mark, repeated up to ``max_tokens``, so a demo's answer reads as what it
is rather than as a broken model. The same key rule holds: a sampled request's mark carries a tag
of its key ("(simulated #3fa2)"), a greedy one's none.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import tokenizers
import xxhash

from wire.sampling import SamplingParams

_M64 = (1 << 64) - 1
# Byte-level BPE (GPT-2/Qwen/Llama 3) and SentencePiece spellings of a leading space.
_SPACE_MARKS = "\u0120\u2581"
ECHO_MARK = "(simulated)"
# The prompt tokens an echo reads (its last line is in there), and the words it repeats.
_ECHO_TAIL = 256
_ECHO_WORDS = 24
# Lines a chat template ends a prompt with (the generation header), skipped by the echo.
_HEADER_LINES = frozenset({"assistant", "assistant:", "model", "model:", "<think>", "</think>",
                           "<|assistant|>", "### response:", "bot:"})


def _is_word(piece: str) -> bool:
    """An ASCII word of 2-12 letters, optionally after a leading-space mark."""
    body = piece.lstrip(_SPACE_MARKS)
    return 2 <= len(body) <= 12 and body.isascii() and body.isalpha()


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


@dataclass(frozen=True)
class TokenTable:
    """The ids the sim emits, the vocabulary size, and the model's EOS ids."""

    ids: tuple[int, ...]
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    # Present when read from a model dir: what the echo output decodes and encodes with.
    tokenizer: tokenizers.Tokenizer | None = field(default=None, repr=False, compare=False)
    special_ids: frozenset[int] = field(default=frozenset(), repr=False, compare=False)
    id_array: npt.NDArray[np.int32] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.ids:
            raise ValueError("the token table is empty")
        object.__setattr__(self, "id_array", np.asarray(self.ids, dtype=np.int32))

    @classmethod
    def from_vocab_size(cls, vocab_size: int, eos_token_ids: tuple[int, ...] = ()) -> TokenTable:
        if vocab_size < 2:
            raise ValueError("vocab_size must be >= 2")
        banned = set(eos_token_ids)
        ids = tuple(i for i in range(vocab_size) if i not in banned)
        return cls(ids, vocab_size, eos_token_ids)

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> TokenTable:
        """Read tokenizer.json (+ generation_config.json / config.json for EOS and vocab size)."""
        # msgspec decodes only the two fields we need: far cheaper than json on a 10 MB file.
        tok = msgspec.json.decode((model_dir / "tokenizer.json").read_bytes(), type=_TokenizerJson)
        vocab = tok.model.vocab
        if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
            vocab = {str(piece): i for i, (piece, _) in enumerate(vocab)}
        special = {t.id for t in tok.added_tokens if t.special}
        eos = _read_eos(model_dir)
        words = [i for piece, i in vocab.items() if i not in special and _is_word(piece)]
        size = max([*vocab.values(), *special, 0]) + 1
        config = model_dir / "config.json"
        if config.exists():
            size = max(size, int(json.loads(config.read_text()).get("vocab_size", size)))
        if len(words) < 64:
            # Not a word-piece vocabulary we recognise: any non-special id will do.
            banned = special | set(eos)
            words = [i for i in vocab.values() if i not in banned]
        tokenizer = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        return cls(tuple(sorted(words)), size, eos, tokenizer, frozenset(special) | set(eos))

    def echo_ids(self, prompt: Sequence[int], sample: int | None = None
                 ) -> tuple[tuple[int, ...], int]:
        """The echo answer to ``prompt``: its ids and where the repeating part starts (the ids
        from there on repeat forever); ``((), 0)`` without a tokenizer. A sampled (not greedy)
        request passes its key as ``sample``: the mark carries a tag of it, so samples differ
        as vLLM's do (per seed, or per request when unseeded)."""
        tok = self.tokenizer
        if tok is None:
            return (), 0
        text = tok.decode(list(prompt[-_ECHO_TAIL:]), skip_special_tokens=True)
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        while lines and lines[-1].lower() in _HEADER_LINES:
            lines.pop()
        said = " ".join(lines[-1].split()[-_ECHO_WORDS:]) if lines else ""
        mark = ECHO_MARK if sample is None else f"{ECHO_MARK[:-1]} #{sample & 0xFFFF:04x})"
        reply = f"{mark} {said}".rstrip()
        first = self._encode(reply)
        again = self._encode(f" {reply}")
        return (*first, *again), len(first)

    def _encode(self, text: str) -> tuple[int, ...]:
        assert self.tokenizer is not None
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return tuple(i for i in ids if i < self.vocab_size and i not in self.special_ids)


class _AddedToken(msgspec.Struct):
    id: int
    special: bool = False


class _TokenizerModel(msgspec.Struct):
    vocab: dict[str, int] | list[list[Any]]


class _TokenizerJson(msgspec.Struct):
    model: _TokenizerModel
    added_tokens: list[_AddedToken] = []


def _read_eos(model_dir: Path) -> tuple[int, ...]:
    for name in ("generation_config.json", "config.json"):
        path = model_dir / name
        if path.exists():
            value = json.loads(path.read_text()).get("eos_token_id")
            if isinstance(value, int):
                return (value,)
            if isinstance(value, list):
                return tuple(int(v) for v in value)
    return ()


def request_key(seed: int, request_id: str, prompt: list[int], params: SamplingParams) -> int:
    """The PRNG stream of one request (see the module docstring)."""
    prompt_hash = xxhash.xxh3_64_intdigest(array("q", prompt).tobytes(), seed=seed)
    if params.temperature == 0.0:
        return prompt_hash
    if params.seed is not None:
        return splitmix64(prompt_hash ^ (params.seed & _M64))
    return xxhash.xxh3_64_intdigest(request_id.encode(), seed=prompt_hash)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_POS = np.uint64(0xD6E8FEB86659FD93)


MARKOV_ORDER = 4


def markov_key(seed: int, request_id: str, params: SamplingParams) -> tuple[int, bool]:
    """A markov request's key and whether its draws also depend on the output position."""
    if params.temperature == 0.0:
        return seed & _M64, False
    if params.seed is not None:
        return splitmix64((seed ^ (params.seed & _M64)) & _M64), True
    return xxhash.xxh3_64_intdigest(request_id.encode(), seed=seed & _M64), True


def markov_token(table: TokenTable, key: int, context: Sequence[int]) -> int:
    """The id after ``context``: a hash of its last MARKOV_ORDER ids under ``key``."""
    tail = array("q", context[-MARKOV_ORDER:]).tobytes()
    return table.ids[xxhash.xxh3_64_intdigest(tail, seed=key) % len(table.ids)]


def token_stream(table: TokenTable, key: int, start: int, n: int) -> list[int]:
    """Output ids for positions ``start .. start+n``: splitmix64 over numpy (wrapping uint64), so
    a running request costs one list lookup per token instead of a Python hash."""
    x = np.arange(start, start + n, dtype=np.uint64) * _POS ^ np.uint64(key)
    x += _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    x ^= x >> np.uint64(31)
    ids: list[int] = table.id_array[x % np.uint64(len(table.ids))].tolist()
    return ids


def echo_stream(echo: tuple[int, ...], loop_from: int, start: int, n: int) -> list[int]:
    """Echo ids for positions ``start .. start+n`` (see ``TokenTable.echo_ids``)."""
    period = len(echo) - loop_from
    return [echo[p] if p < loop_from else echo[loop_from + (p - loop_from) % period]
            for p in range(start, start + n)]


def next_token(table: TokenTable, key: int, position: int) -> int:
    return token_stream(table, key, position, 1)[0]


def logprobs_row(
    table: TokenTable, key: int, position: int, sampled: int, k: int
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]:
    """One LogprobsLists row: column 0 the sampled token, then the top-k (the sampled one first)."""
    ids = np.empty(k + 1, dtype=np.int32)
    ids[0] = sampled
    if k:
        ids[1] = sampled
        if k > 1:
            h = splitmix64(key ^ position)
            start = h % len(table.ids)
            # Consecutive table entries after a hashed start: distinct, cheap, deterministic.
            picks = table.id_array.take(np.arange(start, start + k - 1) % len(table.ids))
            ids[2:] = picks
    top = -np.log1p(np.arange(1, k + 1, dtype=np.float32)) * np.float32(0.5)
    lps = np.empty(k + 1, dtype=np.float32)
    lps[0] = top[0] if k else np.float32(-0.25)
    lps[1:] = top
    return ids, lps
