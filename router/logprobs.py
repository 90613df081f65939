"""Engine logprobs (vLLM LogprobsLists) -> OpenAI chat / completions and vLLM generate shapes.

Each row of the engine's arrays is one generated token: column 0 the sampled token, then the top-k
candidates in rank order. Like vLLM's ``append_logprobs_for_next_position`` the candidates of a
position are the sampled token first and then the top-k without it (a dict in vLLM); chat takes
the first ``top_logprobs`` of them, completions ``logprobs + 1``, generate ``max(k, 1)``.
Logprobs are clamped to -9999.0 (NaN too), as vLLM does for JSON. Token strings follow vLLM
(a token that is part of a multi-byte character shows "" until the token completing it, which
shows the character); ``bytes`` are the token's own raw bytes, so they concatenate to the exact
UTF-8 of the text.

Chat logprobs (6 entries per token at top-5, the costliest part of the stream) are written as
JSON directly: per token id the encoded text and bytes are cached (``TokenDecoder.token_json``)
and the logprobs of one output are encoded by one msgspec call, so an entry is a few bytes
concatenations. The result is exactly what msgspec writes for ``list[ChatLogprobsContent]``
(tests/test_pipeline_logprobs.py holds it to that).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

from router.detokenize import TokenDecoder, token_head
from router.ndarrays import LogprobRows
from router.openai_types import CompletionLogprobs, GenerateLogprob, GenerateLogprobsContent

FLOOR = -9999.0
_FLOOR_JSON = msgspec.json.encode(FLOOR)
_TOP, _NO_TOP = b',"top_logprobs":[', b',"top_logprobs":[]}'
# Preceding sampled tokens tried when a token is part of a UTF-8 character (4 bytes at most).
_CONTEXT = 4


def clamp(lp: float) -> float:
    return FLOOR if math.isnan(lp) else max(lp, FLOOR)


def _floats(lps: Sequence[float]) -> list[bytes]:
    """msgspec's JSON text of each logprob, clamped (NaN compares false, so it is clamped too).

    One encode of the whole output and a split: msgspec's float format (e.g. ``-1e-7``) is not
    ``repr``'s, and one call per number would cost more than the split."""
    return msgspec.json.encode([x if x > FLOOR else FLOOR for x in lps])[1:-1].split(b",")


def _candidates(ids: Sequence[int], lps: Sequence[float], base: int, width: int,
                limit: int) -> list[tuple[int, float, int]]:
    """(token id, logprob, rank) of row ``base // width``'s first ``limit`` distinct
    candidates (``limit < 0``: all): the sampled token first, the rest keep their column."""
    out: list[tuple[int, float, int]] = []
    sampled = ids[base]
    for col in range(width):
        if 0 <= limit <= len(out):
            break
        tid = ids[base + col]
        if col and tid == sampled:
            continue
        out.append((tid, lps[base + col], col))
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

    def _head(self, tid: int) -> bytes:
        return token_head(self._fix(tid, self._td.token_text(tid)))

    def chat(self, token_ids: Sequence[int], rows: LogprobRows | None) -> msgspec.Raw:
        """The chat ``logprobs.content`` list of these tokens, as JSON."""
        td = self._td
        table = td.json_table
        size = len(table)
        info = td.token_json
        limit = self._num
        ctx = self._ctx
        ids: Sequence[int] = ()
        fl: list[bytes] = []
        width = n_rows = 0
        if rows is not None:
            ids, width, n_rows = rows.token_ids, rows.width, rows.num_tokens
            fl = _floats(rows.logprobs)
        parts: list[bytes] = []
        add = parts.extend
        sep = b"["
        for i, tid in enumerate(token_ids):
            e = table[tid] if 0 <= tid < size else None
            if e is None:
                e = info(tid)
            head = e[0]
            if head is None:
                head = self._head(tid)
            if i >= n_rows:
                add((sep, head, _FLOOR_JSON, e[1], _NO_TOP))
            elif not limit:
                add((sep, head, fl[i * width], e[1], _NO_TOP))
            else:
                # The candidates: the sampled token (column 0) first, then the top-k without
                # it, at most ``limit``. This loop runs k+1 times per token.
                base = i * width
                f = fl[base]
                sampled = ids[base]
                if sampled == tid:
                    add((sep, head, f, e[1], _TOP, head, f, e[1]))
                else:  # never from vLLM; kept exact anyway
                    se = table[sampled] if 0 <= sampled < size else None
                    if se is None:
                        se = info(sampled)
                    add((sep, head, f, e[1], _TOP,
                         se[0] if se[0] is not None else self._head(sampled), f, se[1]))
                left = limit - 1
                for col in range(base + 1, base + width):
                    if not left:
                        break
                    t = ids[col]
                    if t == sampled:
                        continue
                    left -= 1
                    te = table[t] if 0 <= t < size else None
                    if te is None:
                        te = info(t)
                    h = te[0]
                    add((b"},", h if h is not None else self._head(t), fl[col], te[1]))
                parts.append(b"}]}")
            sep = b","
            ctx.append(tid)
            if len(ctx) > _CONTEXT:
                del ctx[0]
        parts.append(b"]" if parts else b"[]")
        return msgspec.Raw(b"".join(parts))

    def completion(self, token_ids: Sequence[int], rows: LogprobRows | None) -> CompletionLogprobs:
        text = self._td.token_text
        res = CompletionLogprobs([], [], [], [])
        limit = -1 if self._num < 0 else self._num + 1
        fix = self._fix
        n_rows = 0 if rows is None else rows.num_tokens
        for i, tid in enumerate(token_ids):
            tok = fix(tid, text(tid))
            res.tokens.append(tok)
            res.text_offset.append(self._offset)
            self._offset += len(tok)
            if rows is None or i >= n_rows:
                res.token_logprobs.append(None)
                res.top_logprobs.append(None)
                self._sampled(tid)
                continue
            ids, lps, width = rows.token_ids, rows.logprobs, rows.width
            base = i * width
            res.token_logprobs.append(clamp(lps[base]))
            top = _candidates(ids, lps, base, width, limit)
            res.top_logprobs.append({fix(t, text(t)): clamp(lp) for t, lp, _ in top})
            self._sampled(tid)
        return res

    def generate(
        self, token_ids: Sequence[int], rows: LogprobRows | None
    ) -> list[GenerateLogprobsContent]:
        out = []
        limit = -1 if self._num < 0 else max(self._num, 1)
        n_rows = 0 if rows is None else rows.num_tokens
        for i, tid in enumerate(token_ids):
            if rows is None or i >= n_rows:
                out.append(GenerateLogprobsContent(tid, FLOOR))
                continue
            width = rows.width
            base = i * width
            lps = rows.logprobs
            rank = rows.sampled_ranks[i]
            top = [
                GenerateLogprob(t, clamp(lp), (rank if col == 0 else col) or None)
                for t, lp, col in _candidates(rows.token_ids, lps, base, width, limit)
            ]
            out.append(GenerateLogprobsContent(tid, clamp(lps[base]), rank or None, top))
        return out
