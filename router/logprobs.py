"""Engine logprobs (vLLM LogprobsLists) -> OpenAI chat / completions and vLLM generate shapes.

Each row of the engine's arrays is one generated token: column 0 the sampled token, then the top-k
candidates in rank order. Like vLLM's ``append_logprobs_for_next_position`` the candidates of a
position are the sampled token first and then the top-k without it (a dict in vLLM); chat takes
the first ``top_logprobs`` of them, completions ``logprobs + 1``, generate ``max(k, 1)``.
Logprobs are clamped to -9999.0 (NaN too), as vLLM does for JSON. Token strings follow vLLM
(a token that is part of a multi-byte character shows "" until the token completing it, which
shows the character); ``bytes`` are the token's own raw bytes, so they concatenate to the exact
UTF-8 of the text.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

from router.detokenize import TokenDecoder
from router.ndarrays import Buffer, Logprobs, NdarrayError, decode_logprobs
from router.openai_types import (
    ChatLogprobsContent,
    ChatTopLogprob,
    CompletionLogprobs,
    GenerateLogprob,
    GenerateLogprobsContent,
)

FLOOR = -9999.0
# Preceding sampled tokens tried when a token is part of a UTF-8 character (4 bytes at most).
_CONTEXT = 4


def clamp(lp: float) -> float:
    return FLOOR if math.isnan(lp) else max(lp, FLOOR)


Rows = tuple[list[list[int]], list[list[float]], list[int]]

# Little-endian vLLM dtype strings -> memoryview format codes (this module assumes a
# little-endian host, as vLLM's engines are; other hosts take the numpy path).
_CAST = {"<i4": "i", "<f4": "f", "<i8": "q", "<f8": "d", "<i2": "h", "<f2": "e", "<u4": "I"}
_LITTLE = sys.byteorder == "little"


def _flat(encoded: Any, aux: Sequence[Buffer]) -> tuple[list[Any], list[int]] | None:
    """An encoded ndarray as a flat Python list without numpy, or None if it needs numpy."""
    try:
        dtype, shape, data = encoded
    except (TypeError, ValueError):
        return None
    if isinstance(data, int):
        if not 0 < data < len(aux):
            return None
        data = aux[data]
    code = _CAST.get(dtype) if _LITTLE else None
    if code is None or not isinstance(data, bytes | memoryview):
        return None
    try:
        view = memoryview(data)
        if view.format != "B":
            view = view.cast("B")
        return view.cast(code).tolist(), shape  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


def _split(flat: list[Any], shape: list[int]) -> list[list[Any]]:
    if len(shape) != 2:
        raise NdarrayError(f"logprobs array of shape {shape}, expected 2 dimensions")
    n, w = shape
    if n * w != len(flat):
        raise NdarrayError(f"logprobs array of shape {shape} holds {len(flat)} items")
    return [flat] if n == 1 else [flat[i : i + w] for i in range(0, n * w, w)]


def rows_of(raw: Any, aux: Sequence[Buffer] = ()) -> Rows:
    """Python rows (token ids, logprobs, sampled ranks) of ``EngineCoreOutput.new_logprobs``,
    given either as it comes off the wire or already decoded by the engine client."""
    if not isinstance(raw, Logprobs) and isinstance(raw, list | tuple) and len(raw) >= 3:
        # Small per-step arrays: a memoryview cast is ~10x cheaper than numpy round trips.
        fi, fl, fr = _flat(raw[0], aux), _flat(raw[1], aux), _flat(raw[2], aux)
        if fi is not None and fl is not None and fr is not None:
            if fi[1] == [1, len(fi[0])] and fl[1] == [1, len(fl[0])]:
                return [fi[0]], [fl[0]], fr[0]  # one token this step: no row split
            return _split(*fi), _split(*fl), fr[0]
    lp = raw if isinstance(raw, Logprobs) else decode_logprobs(raw, aux)
    ranks = lp.sampled_ranks.reshape(-1).tolist()
    return lp.token_ids.tolist(), lp.logprobs.tolist(), ranks


def _candidates(ids: list[int], lps: list[float], limit: int) -> list[tuple[int, float, int]]:
    """(token id, logprob, rank) of the first ``limit`` distinct candidates; ``limit < 0``: all."""
    out: list[tuple[int, float, int]] = []
    sampled = ids[0]
    # The sampled token is entry 0; the rest keep their top-k rank (column index).
    for col, tid in enumerate(ids):
        if 0 <= limit <= len(out):
            break
        if col and tid == sampled:
            continue
        out.append((tid, lps[col], col))
    return out


class ChoiceLogprobs:
    """Per output sequence: formats each engine batch's logprobs for one response kind."""

    __slots__ = ("_td", "_num", "_offset", "_ctx")

    def __init__(self, decoder: TokenDecoder, num: int):
        self._td = decoder
        self._num = num  # the requested number of top candidates (-1: all)
        self._offset = 0  # completions text_offset: cumulative token-string lengths
        self._ctx: list[int] = []  # the last sampled ids: context for split characters

    def _sampled(self, tid: int) -> None:
        ctx = self._ctx
        ctx.append(tid)
        if len(ctx) > _CONTEXT:
            del ctx[0]

    def _fix(self, tid: int, text: str) -> str:
        """vLLM's ``_correct_decoded_token``: a token that alone decodes to a trailing U+FFFD
        (part of a UTF-8 character) shows the character it completes after the preceding
        sampled tokens, or "" while still incomplete. Token strings then add up to the text."""
        if not text or text[-1] != "\ufffd":
            return text
        ctx = self._ctx
        dec = self._td.tokenizer.decode
        for n in range(1, len(ctx) + 1):
            context = ctx[-n:]
            full = dec([*context, tid], skip_special_tokens=False)
            if full.endswith("\ufffd"):
                continue
            # Context tokens that were themselves partial contributed no text of their own:
            # their bytes belong to the character this token completes.
            clean = len(context)
            while clean and dec([context[clean - 1]], skip_special_tokens=False).endswith(
                    "\ufffd"):
                clean -= 1
            prefix = dec(context[:clean], skip_special_tokens=False) if clean else ""
            if full.startswith(prefix):
                return full[len(prefix):]
            common = 0
            for a, b in zip(prefix, full, strict=False):
                if a != b:
                    break
                common += 1
            return full[common:]
        return ""

    def chat(self, token_ids: Sequence[int], rows: Rows | None) -> list[ChatLogprobsContent]:
        table = self._td.info_table
        slow = self._td.token_info
        limit = self._num
        ctx = self._ctx
        out = []
        for i, tid in enumerate(token_ids):
            info = table[tid] if 0 <= tid < len(table) else None
            text, raw = info if info is not None else slow(tid)
            if text[-1:] == "\ufffd":
                text = self._fix(tid, text)
            if rows is None or i >= len(rows[0]):
                out.append(ChatLogprobsContent(text, FLOOR, raw, []))
                self._sampled(tid)
                continue
            ids, lps = rows[0][i], rows[1][i]
            # Inlined _candidates (this loop runs k+1 times per token): the sampled token
            # first, then the top-k without it, at most ``limit`` of them.
            top: list[ChatTopLogprob] = []
            left = limit
            sampled = ids[0]
            col = 0
            for t in ids:
                if not left:
                    break
                if col and t == sampled:
                    col += 1
                    continue
                lp = lps[col]
                col += 1
                left -= 1
                tinfo = table[t] if 0 <= t < len(table) else None
                ttext, traw = tinfo if tinfo is not None else slow(t)
                # NaN compares false, so it is clamped too.
                if ttext[-1:] == "\ufffd":
                    ttext = self._fix(t, ttext)
                top.append(ChatTopLogprob(ttext, lp if lp > FLOOR else FLOOR, traw))
            lp0 = lps[0]
            out.append(ChatLogprobsContent(text, lp0 if lp0 > FLOOR else FLOOR, raw, top))
            ctx.append(tid)
            if len(ctx) > _CONTEXT:
                del ctx[0]
        return out

    def completion(self, token_ids: Sequence[int], rows: Rows | None) -> CompletionLogprobs:
        text = self._td.token_text
        res = CompletionLogprobs([], [], [], [])
        limit = -1 if self._num < 0 else self._num + 1
        fix = self._fix
        for i, tid in enumerate(token_ids):
            tok = fix(tid, text(tid))
            res.tokens.append(tok)
            res.text_offset.append(self._offset)
            self._offset += len(tok)
            if rows is None or i >= len(rows[0]):
                res.token_logprobs.append(None)
                res.top_logprobs.append(None)
                self._sampled(tid)
                continue
            ids, lps = rows[0][i], rows[1][i]
            res.token_logprobs.append(clamp(lps[0]))
            top = _candidates(ids, lps, limit)
            res.top_logprobs.append({fix(t, text(t)): clamp(lp) for t, lp, _ in top})
            self._sampled(tid)
        return res

    def generate(
        self, token_ids: Sequence[int], rows: Rows | None
    ) -> list[GenerateLogprobsContent]:
        out = []
        limit = -1 if self._num < 0 else max(self._num, 1)
        for i, tid in enumerate(token_ids):
            if rows is None or i >= len(rows[0]):
                out.append(GenerateLogprobsContent(tid, FLOOR))
                continue
            ids, lps, rank = rows[0][i], rows[1][i], rows[2][i]
            top = [
                GenerateLogprob(t, clamp(lp), (rank if col == 0 else col) or None)
                for t, lp, col in _candidates(ids, lps, limit)
            ]
            out.append(GenerateLogprobsContent(tid, clamp(lps[0]), rank or None, top))
        return out
