"""The one output pipeline: engine outputs -> detokenize -> stop strings -> parser -> chunks.

Per request one ``Pipeline``; per choice (n > 1 fans out to n engine requests) one ``_Choice``.
``feed`` turns ONE engine output (all tokens the engine produced for that choice in one step)
into at most ONE chunk Struct. ``sse_stream`` writes those chunks as SSE events; ``collect``
folds the very same chunks into the non-stream body (output/collect.py), so the two cannot
disagree. The parser stage is an explicit seam: ``ParserFactory`` builds a per-choice
``OutputParser`` (output/parsers/: reasoning and tool-call parsers, as in vLLM's chat serving);
with none configured the text passes through untouched. A parser reads the text with the special
tokens that carry its markers kept, whatever the client's ``skip_special_tokens``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any, Protocol, TypeVar

import msgspec

from output.detokenize import Detokenizer, TokenDecoder
from output.interval import Interval
from output.logprobs import ChoiceLogprobs
from output.openai_types import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    Chunk,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    GenerateChoice,
    GenerateLogprobs,
    GenerateResponse,
    PromptTokensDetails,
    Usage,
)
from output.parsers.emit import ParsedDelta
from output.stop import StopChecker
from serving.errors import EngineOutputError
from wire.engine import FINISH_REASON_STRINGS, EngineCoreOutput, FinishReason
from wire.ndarrays import LogprobRows, rows_of

T = TypeVar("T")

CHAT, COMPLETION, GENERATE = "chat", "completion", "generate"


class OutputParser(Protocol):
    """A chat output parser for one choice (vLLM's reasoning / tool-call parsers' role)."""

    @property
    def empty_content(self) -> str | None: ...

    def parse(self, text: str, token_ids: Sequence[int], finished: bool
              ) -> ParsedDelta | None: ...


class ParserFactory(Protocol):
    """Builds choice ``index``'s parser; says which special tokens its markers need kept in the
    text, whether a tool_choice forces the call (finish_reason "stop" for a named function) and
    whether reasoning is hidden (no logprobs or token ids either)."""

    @property
    def keep_special(self) -> frozenset[int]: ...

    @property
    def forced(self) -> bool: ...

    @property
    def named(self) -> bool: ...

    @property
    def include_reasoning(self) -> bool: ...

    def __call__(self, index: int) -> OutputParser: ...


class PipelineSpec(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Everything the pipeline needs to know about one request, fixed when it starts."""

    kind: str  # CHAT | COMPLETION | GENERATE
    request_id: str
    model: str
    created: int
    prompt_tokens: int
    n: int = 1
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    min_tokens: int = 0
    logprobs: int | None = None  # engine top-k; chat top_logprobs, completions logprobs
    include_usage: bool = False
    continuous_usage: bool = False
    return_token_ids: bool = False
    detokenize: bool = True
    output_mode: str = "tokens"  # generate only: "tokens" | "text"
    # The text echoed ahead of a choice's own: completions the prompt (with its logprobs when
    # asked, in the choice's first chunk), chat the last message (a chunk after the role's).
    echo: str | None = None
    prompt_tail: tuple[int, ...] = ()  # last prompt tokens, seeding non-byte-level decoding
    # The prompt's token ids the client gets: generate and chat/completions with
    # return_token_ids (completions also echo streams: the first chunk of each choice).
    prompt_token_ids: list[int] | None = None
    prompt_ids: list[int] | None = None  # the prompt, when an echo shows its logprobs
    prompt_text: str | None = None  # chat: the templated prompt (return_prompt_text)
    prompt_logprobs: int | None = None  # a body's prompt logprobs: their top-k
    echo_only: bool = False  # completions echo with max_tokens 0: the prompt and nothing else
    tokens_as_ids: bool = False  # logprob tokens as "token_id:N" (return_tokens_as_token_ids)
    logprobs_every: bool = False  # logprob_token_ids: every candidate of a row shown
    usage_details: bool = False  # usage.prompt_tokens_details (--enable-prompt-tokens-details)
    stream_interval: int = 1  # stream: a choice's chunks merged this many tokens at a time
    role: str = "assistant"  # chat: the answer's role


class _Choice:
    __slots__ = ("detok", "stop", "logprobs", "parser", "tokens", "finished", "tool_calls",
                 "fresh", "step", "push")

    def __init__(
        self, detok: Detokenizer | None, stop: StopChecker, lp: ChoiceLogprobs | None,
        parser: OutputParser | None,
    ):
        self.detok = detok
        self.stop = stop
        self.logprobs = lp
        self.parser = parser
        self.tokens = 0
        self.finished = False
        self.tool_calls = False
        self.fresh = True  # no output seen yet (prefill stats ride on the first one)
        # Bound methods for the per-token fast path.
        self.step = detok.step if detok is not None else None
        self.push = stop.push_one if stop.active else None


class Pipeline:
    """Turns one request's engine outputs into OpenAI / vLLM-generate chunk Structs."""

    def __init__(
        self, spec: PipelineSpec, decoder: TokenDecoder, parsers: ParserFactory | None = None
    ):
        self.spec = spec
        self.cached_tokens: int | None = None
        self.kv_transfer_params: dict[str, Any] | None = None  # from the engine's last output
        self.prompt_rows: LogprobRows | None = None  # the prompt's logprobs, as the engine sent
        self._prompt_rows_from = 0  # the choice whose engine request sent them
        self._decoder = decoder
        self._interval = (Interval(spec.stream_interval, spec.n) if spec.stream_interval > 1
                          else None)
        needs_text = spec.kind != GENERATE or spec.output_mode == "text"
        detok = spec.detokenize and (needs_text or bool(spec.stop))
        if spec.kind != CHAT:
            parsers = None
        self.parsers = parsers
        keep = parsers.keep_special if parsers is not None else frozenset()
        self._choices = [
            _Choice(
                decoder.new(skip_special_tokens=spec.skip_special_tokens,
                            prompt_tail=spec.prompt_tail, keep=keep) if detok else None,
                StopChecker(spec.stop if detok else (),
                            include_in_output=spec.include_stop_str_in_output,
                            min_tokens=spec.min_tokens),
                ChoiceLogprobs(decoder, spec.logprobs, as_ids=spec.tokens_as_ids,
                               every=spec.logprobs_every)
                if spec.logprobs is not None else None,
                parsers(i) if parsers is not None else None,
            )
            for i in range(spec.n)
        ]
        # Reasoning hidden: vLLM sends no logprobs or token ids either (they would show it).
        self._hide_ids = parsers is not None and not parsers.include_reasoning
        self._text_out = needs_text
        # Token ids alone justify a chunk when the client sees them (logprobs, ids, generate).
        self._ids_matter = (spec.logprobs is not None or spec.return_token_ids
                            or spec.kind == GENERATE) and not self._hide_ids
        # Plain chat (no parser, usage or ids per chunk) has a per-token fast path, with
        # logprobs or without.
        plain = (spec.kind == CHAT and detok and parsers is None and not spec.continuous_usage
                 and not spec.return_token_ids and self._interval is None)
        self._fast = plain and spec.logprobs is None
        self._fast_lp = plain and spec.logprobs is not None
        self._fast_cmpl = (spec.kind == COMPLETION and detok and spec.logprobs is None
                           and not spec.continuous_usage and not spec.return_token_ids
                           and self._interval is None)

    @property
    def done(self) -> bool:
        return all(c.finished for c in self._choices)

    def empty_content(self, index: int) -> str | None:
        """Choice ``index``'s message content when no text was content: "" as vLLM answers
        without parsers, else what its parsers say."""
        parser = self._choices[index].parser
        return "" if parser is None else parser.empty_content

    @property
    def completion_tokens(self) -> int:
        """Tokens of every choice so far (``usage().completion_tokens`` without the Usage)."""
        return sum(c.tokens for c in self._choices)

    def usage(self, index: int | None = None) -> Usage:
        """Whole-request usage, or (``index``) one choice's, for continuous_usage_stats."""
        spec = self.spec
        if index is None:
            completion = sum(c.tokens for c in self._choices)
        else:
            completion = self._choices[index].tokens
        details = None
        if self.cached_tokens is not None and spec.usage_details:
            details = PromptTokensDetails(cached_tokens=self.cached_tokens)
        return Usage(spec.prompt_tokens, spec.prompt_tokens + completion, completion, details)

    def prompt_logprobs(self, index: int = 0) -> list[dict[str, dict[str, object]] | None] | None:
        """vLLM's ``prompt_logprobs`` field of a body (choice ``index``'s prompt: this one)."""
        if self.spec.prompt_logprobs is None or self.prompt_rows is None:
            return None
        return ChoiceLogprobs(self._decoder, self.spec.prompt_logprobs).prompt_logprobs(
            self.prompt_rows)

    def start(self) -> list[Chunk]:
        """Chunks sent before any engine output: chat's role (with the prompt's ids and text
        when asked) and echoed last message, per choice."""
        spec = self.spec
        usage = self.usage(0) if spec.continuous_usage else None
        if spec.kind != CHAT:
            return []
        out: list[Chunk] = [
            ChatCompletionChunk(spec.request_id, spec.created, spec.model, [
                ChatChunkChoice(i, ChatDelta(role=spec.role, content=""), None, None)],
                usage, spec.prompt_token_ids, spec.prompt_text)
            for i in range(spec.n)
        ]
        if spec.echo:
            out += [self._chat_chunk(ChatChunkChoice(i, ChatDelta(content=spec.echo), None, None),
                                     usage)
                    for i in range(spec.n)]
        return out

    def end(self) -> list[Chunk]:
        """Chunks after every choice finished: the usage chunk if the client asked for it."""
        spec = self.spec
        if not spec.include_usage:
            return []
        usage = self.usage()
        if spec.kind == CHAT:
            return [self._chat_chunk_list([], usage)]
        if spec.kind == COMPLETION:
            return [Completion(id=spec.request_id, created=spec.created, model=spec.model,
                               choices=[], usage=usage)]
        return [GenerateResponse(request_id=spec.request_id, output_mode=spec.output_mode,
                                 choices=[], usage=usage)]

    def feed(self, index: int, out: EngineCoreOutput) -> tuple[Chunk | None, bool]:
        """One engine output of choice ``index`` -> (chunk or None, abort the engine request?).

        ``abort`` is True when the router ended the choice on a stop string while the engine
        is still generating: the caller must send ABORT (the engine sends nothing more).
        """
        choice = self._choices[index]
        ids = out.new_token_ids
        if (self._fast and len(ids) == 1 and not choice.fresh and out.finish_reason is None
                and out.error is None and not choice.finished):
            # The common case, kept flat: one token of a plain chat stream mid-way.
            text = choice.step(ids[0])  # type: ignore[misc]
            if choice.push is not None:
                text, match = choice.push(text)
                if match is not None:
                    choice.tokens += 1
                    choice.finished = True
                    spec = self.spec
                    return ChatCompletionChunk(spec.request_id, spec.created, spec.model, [
                        ChatChunkChoice(index, ChatDelta(None, text), None, "stop",
                                        match.stop)]), True
            choice.tokens += 1
            if not text:
                return None, False
            spec = self.spec
            return ChatCompletionChunk(spec.request_id, spec.created, spec.model, [
                ChatChunkChoice(index, ChatDelta(None, text), None, None)]), False
        if (self._fast_lp and len(ids) == 1 and not choice.fresh and out.finish_reason is None
                and out.error is None and not choice.finished):
            return self._feed_one_lp(choice, index, out)
        if (self._fast_cmpl and len(ids) == 1 and not choice.fresh
                and out.finish_reason is None and out.error is None and not choice.finished):
            return self._feed_one_cmpl(choice, index, out)
        return self._feed(choice, index, out)

    def _feed_one_cmpl(self, choice: _Choice, index: int, out: EngineCoreOutput
                       ) -> tuple[Chunk | None, bool]:
        """``_feed`` for one token of a plain completions stream, mid-way: same chunk."""
        text = choice.step(out.new_token_ids[0])  # type: ignore[misc]
        finish: str | None = None
        stop_reason = out.stop_reason
        kept = 1
        if choice.push is not None:
            text, match = choice.push(text)
            if match is not None:
                kept = min(kept, match.num_tokens_kept)
                finish, stop_reason = "stop", match.stop
                choice.finished = True
        choice.tokens += kept
        if not text and finish is None:
            return None, False
        spec = self.spec
        return Completion(spec.request_id, spec.created, spec.model, [
            CompletionChoice(index, text, None, finish, stop_reason)]), finish is not None

    def _feed_one_lp(self, choice: _Choice, index: int, out: EngineCoreOutput
                     ) -> tuple[Chunk | None, bool]:
        """``_feed`` for one token of a plain chat stream with logprobs, mid-way: same chunk."""
        ids = out.new_token_ids
        text = choice.step(ids[0])  # type: ignore[misc]
        finish: str | None = None
        stop_reason = out.stop_reason
        abort = False
        if choice.push is not None:
            text, match = choice.push(text)
            if match is not None:
                if match.num_tokens_kept < 1:
                    ids = ids[: match.num_tokens_kept]
                finish, stop_reason, abort = "stop", match.stop, True
                choice.finished = True
        choice.tokens += len(ids)
        rows = out.new_logprobs
        if rows is None:
            lp = choice.logprobs.chat(ids, None)  # type: ignore[union-attr]
        elif ids:
            lp = choice.logprobs.chat_one(  # type: ignore[union-attr]
                ids[0], rows if type(rows) is LogprobRows else rows_of(rows))
        else:
            lp = choice.logprobs.chat(ids, rows_of(rows))  # type: ignore[union-attr]
        spec = self.spec
        return ChatCompletionChunk(spec.request_id, spec.created, spec.model, [
            ChatChunkChoice(index, ChatDelta(None, text), ChatLogprobs(lp), finish,
                            stop_reason)]), abort

    def _feed(self, choice: _Choice, index: int, out: EngineCoreOutput
              ) -> tuple[Chunk | None, bool]:
        """Any engine output: errors, the first and last ones, several tokens, n > 1; merged
        ``stream_interval`` tokens at a time when asked."""
        chunk, abort = self._feed_one(choice, index, out)
        if self._interval is not None:
            chunk = self._interval.push(index, chunk, choice.tokens, choice.finished)
        return chunk, abort

    def _feed_one(self, choice: _Choice, index: int, out: EngineCoreOutput
                  ) -> tuple[Chunk | None, bool]:
        if choice.finished:
            return None, False  # e.g. the engine's last step raced our stop-string abort
        first = choice.fresh
        choice.fresh = False
        engine_finish = out.finish_reason
        if out.error is not None or engine_finish == FinishReason.ERROR:
            raise _engine_error(out)
        if out.prefill_stats is not None and self.cached_tokens is None:
            self._note_prefill(out.prefill_stats)
        if out.new_prompt_logprobs_tensors is not None:
            self._add_prompt_rows(index, rows_of(out.new_prompt_logprobs_tensors))
        if out.kv_transfer_params is not None:
            self.kv_transfer_params = out.kv_transfer_params
        ids = out.new_token_ids
        finish: str | None = None
        stop_reason = out.stop_reason
        abort = False
        text = ""
        detok = choice.detok
        if detok is not None:
            # vLLM leaves the EOS / stop-token text out unless include_stop_str_in_output.
            n_text = len(ids)
            if (engine_finish == FinishReason.STOP and n_text
                    and not self.spec.include_stop_str_in_output):
                n_text -= 1
            stop = choice.stop
            if stop.active:
                pieces = [detok.step(ids[i]) for i in range(n_text)]
                if engine_finish is not None:
                    _add_tail(pieces, detok)
                text, match = stop.push_one(pieces[0]) if len(pieces) == 1 else stop.push(pieces)
                if match is not None:
                    if match.num_tokens_kept < len(ids):
                        ids = ids[: match.num_tokens_kept]
                    finish, stop_reason = "stop", match.stop
                    abort = engine_finish is None
                elif engine_finish is not None:
                    text += stop.finish()
            else:
                step = detok.step
                text = "".join([step(ids[i]) for i in range(n_text)]) if n_text != 1 else step(
                    ids[0])
                if engine_finish is not None:
                    text += detok.flush()
        if finish is None and engine_finish is not None:
            finish = FINISH_REASON_STRINGS[engine_finish]
        choice.tokens += len(ids)
        if finish is not None:
            choice.finished = True
        if not text and finish is None and not (ids and self._ids_matter):
            return None, False
        spec = self.spec
        if spec.kind == CHAT:
            return self._chat(index, choice, out, ids, text, finish, stop_reason), abort
        if spec.kind == COMPLETION:
            return self._completion(index, choice, out, ids, text, finish, stop_reason,
                                    first), abort
        return self._generate(index, choice, out, ids, text, finish, stop_reason), abort

    def _completion(
        self, index: int, choice: _Choice, out: EngineCoreOutput, ids: Sequence[int],
        text: str, finish: str | None, stop_reason: int | str | None, first: bool,
    ) -> Completion:
        """A completions chunk; a choice's first one echoes the prompt (its text, its logprobs
        ahead of the completion's) and carries its ids, as vLLM's stream does."""
        spec = self.spec
        lp = choice.logprobs
        logprobs: CompletionLogprobs | None = None
        prompt_ids = None
        if first and spec.echo is not None:
            if lp is not None:
                logprobs = lp.completion_prompt(spec.prompt_ids or [], self.prompt_rows)
            if spec.echo_only:
                text = spec.echo
            else:
                text = spec.echo + text
        if lp is not None and not (first and spec.echo_only):
            own = lp.completion(ids, _rows(out))
            logprobs = own if logprobs is None else _joined(logprobs, own)
        if first and (spec.echo is not None or spec.return_token_ids):
            prompt_ids = spec.prompt_token_ids
        choice_obj = CompletionChoice(index, text, logprobs, finish, stop_reason,
                                      list(ids) if spec.return_token_ids else None, prompt_ids)
        usage = self.usage(index) if spec.continuous_usage else None
        return Completion(id=spec.request_id, created=spec.created, model=spec.model,
                          choices=[choice_obj], usage=usage)

    def _add_prompt_rows(self, index: int, rows: LogprobRows) -> None:
        """The prompt's logprob rows, in the order the engine sends them (a prompt prefilled
        in chunks comes in several), from one choice (with n > 1 every choice's request sends
        the same)."""
        held = self.prompt_rows
        if held is None:
            self.prompt_rows, self._prompt_rows_from = rows, index
            return
        if index != self._prompt_rows_from:
            return
        self.prompt_rows = LogprobRows([*held.token_ids, *rows.token_ids],
                                       [*held.logprobs, *rows.logprobs],
                                       [*held.sampled_ranks, *rows.sampled_ranks], held.width)

    def _note_prefill(self, prefill_stats: dict[str, Any]) -> None:
        cached = prefill_stats.get("num_cached_tokens")
        if isinstance(cached, int):
            self.cached_tokens = cached

    def _chat(
        self, index: int, choice: _Choice, out: EngineCoreOutput, ids: Sequence[int], text: str,
        finish: str | None, stop_reason: int | str | None,
    ) -> ChatCompletionChunk | None:
        spec = self.spec
        parser = choice.parser
        if parser is None:
            delta = ChatDelta(content=text)
        else:
            parsed = parser.parse(text, ids, finish is not None)
            if parsed is None:
                if finish is None and not (ids and self._ids_matter):
                    return None
                delta = ChatDelta()
            else:
                reasoning = parsed.reasoning_content
                delta = ChatDelta(content=parsed.content, reasoning_content=reasoning,
                                  reasoning=reasoning, tool_calls=parsed.tool_calls)
                choice.tool_calls = choice.tool_calls or bool(parsed.tool_calls)
            assert self.parsers is not None
            if finish == "stop" and choice.tool_calls and not self.parsers.named:
                finish = "tool_calls"
        lp = choice.logprobs
        logprobs = (ChatLogprobs(lp.chat(ids, _rows(out)))
                    if lp is not None and not self._hide_ids else None)
        usage = self.usage(index) if spec.continuous_usage else None
        token_ids = list(ids) if spec.return_token_ids and not self._hide_ids else None
        return self._chat_chunk(
            ChatChunkChoice(index, delta, logprobs, finish, stop_reason, token_ids), usage)

    def _chat_chunk(self, c: ChatChunkChoice, usage: Usage | None) -> ChatCompletionChunk:
        return self._chat_chunk_list([c], usage)

    def _chat_chunk_list(
        self, choices: list[ChatChunkChoice], usage: Usage | None
    ) -> ChatCompletionChunk:
        spec = self.spec
        return ChatCompletionChunk(id=spec.request_id, created=spec.created, model=spec.model,
                                   choices=choices, usage=usage)

    def _generate(
        self, index: int, choice: _Choice, out: EngineCoreOutput, ids: Sequence[int], text: str,
        finish: str | None, stop_reason: int | str | None,
    ) -> GenerateResponse:
        spec = self.spec
        lp = choice.logprobs
        logprobs: GenerateLogprobs | ChatLogprobs | None = None
        if lp is not None:
            rows = _rows(out)
            logprobs = (ChatLogprobs(lp.chat(ids, rows)) if self._text_out
                        else GenerateLogprobs(lp.generate(ids, rows)))
        gen = GenerateChoice(index, finish, stop_reason, list(ids),
                             text if self._text_out else None, logprobs)
        usage = self.usage(index) if spec.continuous_usage else None
        return GenerateResponse(request_id=spec.request_id, output_mode=spec.output_mode,
                                choices=[gen], usage=usage)


def _engine_error(out: EngineCoreOutput) -> EngineOutputError:
    if out.error is not None:
        code = out.error.code
        return EngineOutputError(out.error.message, code if 400 <= code < 600 else 500)
    return EngineOutputError("The engine failed while generating this request.")


def _add_tail(pieces: list[str], detok: Detokenizer) -> None:
    """The bytes a detokenizer withheld, at the end: they belong to the last token, not to a
    token of their own."""
    if tail := detok.flush():
        if pieces:
            pieces[-1] += tail
        else:
            pieces.append(tail)


def _joined(a: CompletionLogprobs, b: CompletionLogprobs) -> CompletionLogprobs:
    return CompletionLogprobs(a.text_offset + b.text_offset, a.token_logprobs + b.token_logprobs,
                              a.tokens + b.tokens, a.top_logprobs + b.top_logprobs)


def _rows(out: EngineCoreOutput) -> LogprobRows | None:
    return None if out.new_logprobs is None else rows_of(out.new_logprobs)


async def interleave(streams: Iterable[tuple[int, AsyncIterator[T]]],
                     arrived: deque[tuple[int, T]] | None = None,
                     ) -> AsyncIterator[tuple[int, T]]:
    """The outputs of n choices' streams, each ``(index, stream)``, as (index, output) in
    arrival order; the first error wins. ``arrived`` holds what came and is not yet yielded
    (a caller may seed it, and look whether an output waits without awaiting one)."""
    merged: deque[tuple[int, T]] = deque() if arrived is None else arrived
    wake: list[asyncio.Future[None] | None] = [None]
    failure: list[BaseException] = []
    running = 0

    def notify() -> None:
        fut = wake[0]
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def pump(i: int, stream: AsyncIterator[T]) -> None:
        nonlocal running
        try:
            async for out in stream:
                merged.append((i, out))
                notify()
        except BaseException as exc:  # handed to the consumer, which re-raises it
            failure.append(exc)
            raise
        finally:
            running -= 1
            notify()

    tasks = [asyncio.ensure_future(pump(i, it)) for i, it in streams]
    running = len(tasks)
    try:
        while True:
            if merged:
                yield merged.popleft()
            elif failure:
                raise failure[0]
            elif not running:
                return
            else:
                fut = wake[0] = asyncio.get_running_loop().create_future()
                try:
                    await fut
                finally:
                    wake[0] = None
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
