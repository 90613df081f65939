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
JSON directly: per token id the encoded text and bytes are cached (``TokenDecoder.token_json``).
When the engine client decoded the output (``LogprobRows.frame``), the content JSON of every
output of the whole engine message is built by a few C calls at once
(``logprob_frame.chat_contents``) and a streamed token (``chat_one``) takes its own; otherwise
each entry is a few bytes concatenations (``chat``). Both give exactly what msgspec writes for
``list[ChatLogprobsContent]`` (tests/test_pipeline_logprobs_json.py and
tests/test_pipeline_logprobs_frame.py hold them to it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import chain, repeat
from operator import itemgetter

import msgspec

from output.detokenize import CONTEXT_HEAD, TokenDecoder, token_head
from output.openai_types import CompletionLogprobs, GenerateLogprob, GenerateLogprobsContent
from wire.logprob_frame import FLOOR, TOP, FrameLogprobs, clamp, float_texts
from wire.ndarrays import LogprobRows

__all__ = ["FLOOR", "ChoiceLogprobs", "clamp"]

_FLOOR_JSON = msgspec.json.encode(FLOOR)
_NO_TOP = b',"top_logprobs":[]}'
# Preceding sampled tokens tried when a token is part of a UTF-8 character (4 bytes at most).
_CONTEXT = 4


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


def token_id_text(token_id: int) -> str:
    """vLLM's ``return_tokens_as_token_ids`` spelling of a token."""
    return f"token_id:{token_id}"


def _as_id(token_id: int, text: str) -> str:
    return token_id_text(token_id)


class ChoiceLogprobs:
    """Per output sequence: formats each engine batch's logprobs for one response kind.

    ``as_ids``: tokens shown as ``token_id:N`` (vLLM's ``return_tokens_as_token_ids``);
    ``every``: every candidate of a row shown (the row holds the request's
    ``logprob_token_ids``, which vLLM returns all of). Either takes the plain formatting path."""

    __slots__ = ("_td", "_num", "_offset", "_ctx", "_as_ids", "_every")

    def __init__(self, decoder: TokenDecoder, num: int, *, as_ids: bool = False,
                 every: bool = False):
        self._td = decoder
        self._num = -1 if every else num  # the requested number of top candidates (-1: all)
        self._offset = 0  # completions text_offset: cumulative token-string lengths
        self._ctx: list[int] = []  # the last sampled ids: context for split characters
        self._as_ids = as_ids
        self._every = every

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
        dec = self._decode
        for n in range(1, len(ctx) + 1):
            context = ctx[-n:]
            full = dec([*context, tid])
            if full.endswith("\ufffd"):
                continue
            # Context tokens that were themselves partial contributed no text of their own:
            # their bytes belong to the character this token completes.
            clean = len(context)
            while clean and dec([context[clean - 1]]).endswith("\ufffd"):
                clean -= 1
            prefix = dec(context[:clean]) if clean else ""
            if full.startswith(prefix):
                return full[len(prefix):]
            common = 0
            for a, b in zip(prefix, full, strict=False):
                if a != b:
                    break
                common += 1
            return full[common:]
        return ""

    def _decode(self, ids: list[int]) -> str:
        """``tokenizer.decode(ids, skip_special_tokens=False)``; for byte-level BPE the lossy
        UTF-8 of the ids' bytes, which is what it is by definition, at a fraction of the cost
        (tests/test_pipeline_logprobs_json.py holds the two equal)."""
        raw = self._td.raw_table
        if raw is None:
            return self._td.tokenizer.decode(ids, skip_special_tokens=False)
        size = len(raw)
        return b"".join([raw[i] for i in ids if 0 <= i < size]).decode("utf-8", "replace")

    def _head(self, tid: int) -> bytes:
        return token_head(self._fix(tid, self._td.token_text(tid)))

    def chat(self, token_ids: Sequence[int], rows: LogprobRows | None) -> msgspec.Raw:
        """The chat ``logprobs.content`` list of these tokens, as JSON."""
        if self._as_ids or self._every:
            return self._chat_plain(token_ids, rows)
        td = self._td
        table = td.json_table
        size = len(table)
        info = td.token_json
        limit = self._num
        ctx = self._ctx
        ids: Sequence[int] = ()
        fl: list[bytes] = []
        width = n_rows = off = 0
        if rows is not None:
            ids, width, n_rows = rows.token_ids, rows.width, rows.num_tokens
            if rows.frame is not None:
                # Encoded once for every output of the engine message (decode_engine_outputs).
                fl, off = rows.frame.texts(), rows.offset
            else:
                fl = float_texts(rows.logprobs)
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
                add((sep, head, fl[off + i * width], e[1], _NO_TOP))
            else:
                # The candidates: the sampled token (column 0) first, then the top-k without
                # it, at most ``limit``. This loop runs k+1 times per token.
                base = i * width
                f = fl[off + base]
                sampled = ids[base]
                if sampled == tid:
                    add((sep, head, f, e[1], TOP, head, f, e[1]))
                else:  # never from vLLM; kept exact anyway
                    se = table[sampled] if 0 <= sampled < size else None
                    if se is None:
                        se = info(sampled)
                    add((sep, head, f, e[1], TOP,
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
                    add((b"},", h if h is not None else self._head(t), fl[off + col], te[1]))
                parts.append(b"}]}")
            sep = b","
            ctx.append(tid)
            if len(ctx) > _CONTEXT:
                del ctx[0]
        parts.append(b"]" if parts else b"[]")
        return msgspec.Raw(b"".join(parts))

    def chat_one(self, tid: int, rows: LogprobRows) -> msgspec.Raw:
        """``chat([tid], rows)`` for the streaming case, one token and its row: the content
        JSON made for every output of the engine message at once (``chat_contents``). Valid
        when the sampled token is column 0 and does not recur among the next ``limit - 1``
        columns (always so from vLLM): the candidates are then exactly those columns."""
        ids = rows.token_ids
        limit = self._num
        frame = rows.frame
        width = rows.width
        if self._as_ids or self._every:
            return self.chat((tid,), rows)
        # count, not ``in ids[1:limit]``: no tuple to allocate (a recurrence past ``limit``
        # takes the general path needlessly, exactly all the same).
        if (frame is None or frame.width != width or not 0 < limit <= width
                or ids[0] != tid or ids.count(tid) != 1):
            return self.chat((tid,), rows)
        key = (self._td, limit)
        got = frame.entries.get(key)
        if got is None:
            if key in frame.entries:
                return self.chat((tid,), rows)
            got = frame.entries[key] = chat_contents(frame, self._td, limit)
            if got is None:
                return self.chat((tid,), rows)
        contents, context = got
        js = contents[rows.offset // width]
        if context and CONTEXT_HEAD in js:
            # A token whose shown text depends on the preceding ones: the general path.
            return self.chat((tid,), rows)
        ctx = self._ctx
        ctx.append(tid)
        if len(ctx) > _CONTEXT:
            del ctx[0]
        return msgspec.Raw(js)

    def _shown(self, tid: int) -> str:
        """A token as a logprob entry shows it."""
        if self._as_ids:
            return token_id_text(tid)
        return self._fix(tid, self._td.token_text(tid))

    def _chat_plain(self, token_ids: Sequence[int], rows: LogprobRows | None) -> msgspec.Raw:
        """``chat`` entry by entry: for ``as_ids`` (a candidate's bytes are then those of its
        ``token_id:N`` text, as vLLM's) and ``every``."""
        tb = self._td.token_bytes
        out: list[dict[str, object]] = []
        n_rows = 0 if rows is None else rows.num_tokens
        for i, tid in enumerate(token_ids):
            entry: dict[str, object] = {"token": self._shown(tid), "logprob": FLOOR,
                                        "bytes": list(tb(tid)), "top_logprobs": []}
            if rows is not None and i < n_rows:
                width = rows.width
                base = i * width
                entry["logprob"] = clamp(rows.logprobs[base])
                entry["top_logprobs"] = [
                    {"token": self._shown(t), "logprob": clamp(lp),
                     "bytes": list(token_id_text(t).encode() if self._as_ids else tb(t))}
                    for t, lp, _ in _candidates(rows.token_ids, rows.logprobs, base, width,
                                                self._num)]
            out.append(entry)
            self._sampled(tid)
        return msgspec.Raw(msgspec.json.encode(out))

    def completion_prompt(self, prompt_ids: Sequence[int], rows: LogprobRows | None
                          ) -> CompletionLogprobs:
        """An echoed prompt's entries, ahead of the completion's own: the first token has no
        logprob, each next one its prompt-logprob row. Its split characters take the prompt's
        tokens as context, not the sampled ones (vLLM keeps the two apart)."""
        ctx, self._ctx = self._ctx, []
        try:
            head = self.completion(prompt_ids[:1], None)
            rest = self.completion(prompt_ids[1:], rows)
        finally:
            self._ctx = ctx
        return CompletionLogprobs(head.text_offset + rest.text_offset,
                                  head.token_logprobs + rest.token_logprobs,
                                  head.tokens + rest.tokens, head.top_logprobs + rest.top_logprobs)

    def prompt_logprobs(self, rows: LogprobRows) -> list[dict[str, dict[str, object]] | None]:
        """vLLM's ``prompt_logprobs`` field: None for the first prompt token, then per position
        its token (the row's column 0, with its rank) and the top candidates (ranks 1..k), keyed
        by token id. A candidate equal to the prompt token keeps its place and takes the later
        column's values, as vLLM's dict does."""
        out: list[dict[str, dict[str, object]] | None] = [None]
        ids, lps, width = rows.token_ids, rows.logprobs, rows.width
        for i in range(rows.num_tokens):
            base = i * width
            entry: dict[str, dict[str, object]] = {}
            for col in range(width):
                t = ids[base + col]
                entry[str(t)] = {"logprob": clamp(lps[base + col]),
                                 "rank": rows.sampled_ranks[i] if col == 0 else col,
                                 "decoded_token": self._fix(t, self._td.token_text(t))}
            out.append(entry)
            self._sampled(ids[base])
        return out

    def completion(self, token_ids: Sequence[int], rows: LogprobRows | None) -> CompletionLogprobs:
        text = self._td.token_text
        res = CompletionLogprobs([], [], [], [])
        limit = -1 if self._num < 0 else self._num + 1
        fix: Callable[[int, str], str] = self._fix
        if self._as_ids:
            fix = _as_id
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


def chat_contents(frame: FrameLogprobs, td: TokenDecoder, limit: int
                  ) -> tuple[list[bytes], bool] | None:
    """Per output of the message (each one row of ``frame.width`` columns, column 0 the
    sampled token), its chat ``logprobs.content`` JSON with the first ``limit`` columns as
    top_logprobs; and whether any head is ``CONTEXT_HEAD`` (a token whose shown text depends
    on the preceding ones: the caller must check its output's JSON and fall back). None if
    an id is outside the vocabulary or the outputs are not one row each.

    The pieces of all outputs are interleaved by ``zip`` over column slices and joined per
    output by ``map``: a few C calls per message instead of Python work per candidate."""
    width = frame.width
    ids = frame.token_ids()
    if not width or not 0 < limit <= width or not ids:
        return None
    heads, tails = td.head_table, td.tail_table
    # Only the first ``limit`` columns are shown: ids, table entries and float texts are taken
    # per column, each a slice across all outputs.
    id_cols = [ids[col::width] for col in range(limit)]
    if min(map(min, id_cols)) < 0:
        return None
    lps = frame.logprobs()
    f_cols = [float_texts(lps[col::width]) for col in range(limit)]
    for attempt in (0, 1):
        h_cols, t_cols = [], []
        for col_ids in id_cols:
            pick = itemgetter(*col_ids) if len(col_ids) > 1 else _one(col_ids[0])
            try:
                h_cols.append(pick(heads))
                t_cols.append(pick(tails))
            except IndexError:  # an id outside the vocabulary (tokenizers' decode skips it)
                return None
        try:
            return _interleave(h_cols, f_cols, t_cols), any(CONTEXT_HEAD in h for h in h_cols)
        except TypeError:  # ids met for the first time: their fragments are made now
            if attempt:
                raise
            for i in set(chain.from_iterable(id_cols)):
                if heads[i] is None:
                    td.token_json(i)
    return None  # not reached


def _one(i: int) -> Callable[[Sequence[bytes | None]], tuple[bytes | None]]:
    return lambda table: (table[i],)


def _interleave(h: list[Sequence[bytes | None]], f: list[list[bytes]],
                t: list[Sequence[bytes | None]]) -> list[bytes]:
    seqs: list[Iterable[bytes | None]] = [repeat(b"["), h[0], f[0], t[0], repeat(TOP), h[0],
                                          f[0], t[0]]
    for col in range(1, len(h)):
        seqs += (repeat(b"},"), h[col], f[col], t[col])
    seqs.append(repeat(b"}]}]"))
    # The repeats are endless: the columns (one item per output) end the zip.
    return list(map(b"".join, zip(*seqs, strict=False)))
