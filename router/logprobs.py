"""Engine logprobs (vLLM LogprobsLists) -> OpenAI chat / completions and vLLM generate shapes.

Each row of the engine's arrays is one generated token: column 0 the sampled token, then the top-k
candidates in rank order. Like vLLM's ``append_logprobs_for_next_position`` the candidates of a
position are the sampled token first and then the top-k without it (a dict in vLLM); chat takes
the first ``top_logprobs`` of them, completions ``logprobs + 1``, generate ``max(k, 1)``.
Logprobs are clamped to -9999.0 (NaN too), as vLLM does for JSON.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from router.detokenize import TokenDecoder
from router.ndarrays import Buffer, Logprobs, decode_logprobs
from router.openai_types import (
    ChatLogprobsContent,
    ChatTopLogprob,
    CompletionLogprobs,
    GenerateLogprob,
    GenerateLogprobsContent,
)

FLOOR = -9999.0


def clamp(lp: float) -> float:
    return FLOOR if math.isnan(lp) else max(lp, FLOOR)


Rows = tuple[list[list[int]], list[list[float]], list[int]]


def rows_of(raw: Any, aux: Sequence[Buffer] = ()) -> Rows:
    """Python rows (token ids, logprobs, sampled ranks) of ``EngineCoreOutput.new_logprobs``,
    given either as it comes off the wire or already decoded by the engine client."""
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

    __slots__ = ("_td", "_num", "_offset", "_bytes_cache")

    def __init__(self, decoder: TokenDecoder, num: int):
        self._td = decoder
        self._num = num  # the requested number of top candidates (-1: all)
        self._offset = 0  # completions text_offset: cumulative token-string lengths
        self._bytes_cache: dict[int, list[int]] = {}

    def _bytes(self, tid: int) -> list[int]:
        b = self._bytes_cache.get(tid)
        if b is None:
            b = self._bytes_cache[tid] = list(self._td.token_bytes(tid))
        return b

    def chat(self, token_ids: Sequence[int], rows: Rows | None) -> list[ChatLogprobsContent]:
        text = self._td.token_text
        out = []
        for i, tid in enumerate(token_ids):
            if rows is None or i >= len(rows[0]):
                out.append(ChatLogprobsContent(text(tid), FLOOR, self._bytes(tid), []))
                continue
            ids, lps = rows[0][i], rows[1][i]
            top = [
                ChatTopLogprob(text(t), clamp(lp), self._bytes(t))
                for t, lp, _ in _candidates(ids, lps, self._num)
            ]
            out.append(ChatLogprobsContent(text(tid), clamp(lps[0]), self._bytes(tid), top))
        return out

    def completion(self, token_ids: Sequence[int], rows: Rows | None) -> CompletionLogprobs:
        text = self._td.token_text
        res = CompletionLogprobs([], [], [], [])
        limit = -1 if self._num < 0 else self._num + 1
        for i, tid in enumerate(token_ids):
            tok = text(tid)
            res.tokens.append(tok)
            res.text_offset.append(self._offset)
            self._offset += len(tok)
            if rows is None or i >= len(rows[0]):
                res.token_logprobs.append(None)
                res.top_logprobs.append(None)
                continue
            ids, lps = rows[0][i], rows[1][i]
            res.token_logprobs.append(clamp(lps[0]))
            top = _candidates(ids, lps, limit)
            res.top_logprobs.append({text(t): clamp(lp) for t, lp, _ in top})
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
