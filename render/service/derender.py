"""Derender: a generate response's token ids back to the OpenAI answer, as vLLM 0.32's render
server gives it (``OnlineDerenderer``), through the same output pipeline and parsers as the router.

Non-stream: every choice's ids go through one ``Pipeline`` and its chunks are collected. Stream:
the endpoint is stateless, so each call rebuilds the pipeline and replays the earlier chunks of
the output (``stream_state.output_token_ids`` in their original chunks, as vLLM replays its
parser) before this chunk, whose deltas are the answer; without a parser only the last sampled
ids are replayed, to carry a character split between chunks. What vLLM's derender does, kvroute
does: every token is decoded (the end-of-sequence token's text too, special tokens kept where a
parser reads), the non-stream ``finish_reason`` is passed through, a stream's becomes
``tool_calls`` after calls, and logprobs get their token text (U+FFFD repaired with the preceding
ids) except on a parsed stream.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import msgspec

from output.collect import Collector
from output.detokenize import TokenDecoder
from output.openai_types import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatLogprobs,
    ChatLogprobsContent,
    ChatTopLogprob,
    Completion,
    CompletionLogprobs,
    Usage,
)
from output.parsers.registry import ModelParsers, RequestParsers, options_of
from output.pipeline import CHAT, COMPLETION, Pipeline, PipelineSpec
from render.errors import BadRequestError
from render.protocol import ChatCompletionRequest, CompletionRequest, NamedToolChoice
from render.service.derender_protocol import (
    DerenderChatRequest,
    DerenderChatStreamRequest,
    DerenderCompletionRequest,
    DerenderCompletionStreamRequest,
    DerenderStreamState,
    GenerateLogprobs,
)
from wire.engine import EngineCoreOutput, FinishReason

_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}
CONTEXT = 4  # the sampled ids vLLM's logprob repair and the next chunk's decoding look back on
NEED_CHAT = ("chat_request is required when a tool or reasoning parser is configured because "
             "plain detokenization would leak raw parser markup into content.")
NEED_PROMPT = ("prompt_token_ids is required when a tool or reasoning parser is configured. "
               "Without it parse_delta cannot tell whether the prompt left reasoning open (e.g. "
               "a chat template that pre-opens <think>) and would misclassify reasoning content "
               "as plain content.")


class Derenderer:
    """One model's derender: its decoder and output parsers."""

    def __init__(self, name: str, decoder: TokenDecoder, parsers: ModelParsers | None) -> None:
        self.name = name
        self.decoder = decoder
        self.parsers = parsers if parsers is not None and parsers.active else None

    # -- chat -----------------------------------------------------------------------------

    def chat(self, req: DerenderChatRequest) -> dict[str, Any]:
        gen = req.generate_response
        chat = req.chat_request
        if self.parsers is not None and chat is None:
            raise BadRequestError(NEED_CHAT)
        prompt = req.prompt_token_ids if req.prompt_token_ids is not None \
            else gen.prompt_token_ids or []
        factory = self._factory(chat, prompt)
        n = max((c.index for c in gen.choices), default=-1) + 1
        pipeline = Pipeline(self._spec(CHAT, gen.request_id, req.model, n, chat, prompt,
                                       factory, req.prompt_tokens), self.decoder, factory)
        col = Collector(pipeline)
        for c in gen.choices:
            if not c.token_ids:
                raise BadRequestError(f"choice {c.index} has empty or null token_ids")
            chunk, _ = pipeline.feed(c.index, _output(c.token_ids, c.finish_reason or "stop",
                                                      c.stop_reason))
            if chunk is not None:
                col.add(chunk)
        completion = sum(len(c.token_ids or ()) for c in gen.choices)
        body = col.body(_usage(req.prompt_tokens or 0, completion))
        assert isinstance(body, ChatCompletion)
        by_index = {c.index: c for c in gen.choices}
        forced = chat is not None and (chat.tool_choice == "required"
                                       or isinstance(chat.tool_choice, NamedToolChoice))
        keep_ids = chat is not None and bool(chat.return_token_ids) and (
            factory is None or chat.include_reasoning)
        choices = []
        for choice in body.choices:
            src = by_index.get(choice.index)
            if src is None:  # an index no choice has (vLLM answers the choices it got)
                continue
            msg = choice.message
            # vLLM's derender message: ``reasoning`` only, and calls named afresh, no index.
            calls = [{"id": f"{uuid.uuid4().int & (2**64 - 1):016x}", "type": "function",
                      "function": msgspec.to_builtins(call.function)}
                     for call in msg.tool_calls]
            content = "" if forced and msg.content is None else msg.content
            choices.append({
                "index": choice.index,
                "message": {"role": "assistant", "content": content, "reasoning": msg.reasoning,
                            **({"tool_calls": calls} if calls else {})},
                "logprobs": (msgspec.to_builtins(_chat_logprobs(self.decoder, src.logprobs, []))
                             if src.logprobs is not None else None),
                "finish_reason": src.finish_reason, "stop_reason": src.stop_reason,
                "token_ids": list(src.token_ids or ()) if keep_ids else None})
        return {"id": gen.request_id, "object": "chat.completion", "created": int(time.time()),
                "model": req.model or self.name, "choices": choices,
                "usage": msgspec.to_builtins(body.usage),
                "prompt_logprobs": gen.prompt_logprobs,
                "kv_transfer_params": gen.kv_transfer_params, "metrics": gen.metrics}

    def chat_stream(self, req: DerenderChatStreamRequest
                    ) -> tuple[dict[str, Any], DerenderStreamState]:
        gen = req.generate_chunk
        chat = req.chat_request
        if len(gen.choices) > 1:
            raise BadRequestError("derender_chat_stream expects at most one choice per chunk "
                                  f"(got {len(gen.choices)}).")
        if self.parsers is not None:
            if chat is None:
                raise BadRequestError(NEED_CHAT)
            if req.prompt_token_ids is None:
                raise BadRequestError(NEED_PROMPT)
        state = req.stream_state or DerenderStreamState()
        prompt = req.prompt_token_ids if req.prompt_token_ids is not None \
            else gen.prompt_token_ids or []
        factory = self._factory(chat, prompt)
        parsed = factory is not None
        pipeline = Pipeline(self._spec(CHAT, gen.request_id, req.model, 1, chat, prompt,
                                       factory, req.prompt_tokens), self.decoder, factory)
        pipeline.start()
        history = state.output_token_ids if parsed else state.logprob_context_token_ids
        lens = state.output_chunk_lens if parsed else [len(history)] if history else []
        _replay(pipeline, history, lens)
        choices: list[dict[str, Any]] = []
        new = list(state.output_token_ids)
        chunk_lens = list(state.output_chunk_lens)
        ids_sent = list(state.last_tool_call_ids)
        tools = state.tools_streamed
        for c in gen.choices:
            ids = c.token_ids or []
            finish = c.finish_reason
            chunk = None
            if ids or finish is not None:
                chunk, _ = pipeline.feed(0, _output(ids, finish, c.stop_reason))
            choice = _choice(chunk, c.index)
            delta = choice["delta"]
            if ids:
                new.extend(ids)
                chunk_lens.append(len(ids))
            for tc in delta.get("tool_calls") or []:
                tools = True
                if "id" in tc:
                    if tc["index"] < len(ids_sent):
                        tc["id"] = ids_sent[tc["index"]]
                    else:
                        ids_sent.append(tc["id"])
            if not state.role_sent:
                delta["role"] = "assistant"
            named = chat is not None and isinstance(chat.tool_choice, NamedToolChoice)
            choice["finish_reason"] = ("tool_calls" if finish is not None and tools
                                       and not named else finish)
            choice["stop_reason"] = c.stop_reason
            keep_ids = chat is not None and bool(chat.return_token_ids) and (
                not parsed or chat.include_reasoning)
            choice["token_ids"] = list(ids) if keep_ids else None
            choice["logprobs"] = None if parsed or c.logprobs is None else msgspec.to_builtins(
                _chat_logprobs(self.decoder, c.logprobs, state.logprob_context_token_ids))
            choices.append(choice)
        ctx = (list(state.logprob_context_token_ids)
               + [i for c in gen.choices for i in c.token_ids or ()])[-CONTEXT:]
        next_state = msgspec.structs.replace(
            state, role_sent=state.role_sent or bool(gen.choices),
            logprob_context_token_ids=state.logprob_context_token_ids if parsed else ctx,
            output_token_ids=new if parsed else [], output_chunk_lens=chunk_lens if parsed else [],
            tools_streamed=tools, last_tool_call_ids=ids_sent)
        usage = _stream_usage(gen.usage, req.prompt_tokens)
        out = {"id": gen.request_id, "object": "chat.completion.chunk",
               "created": int(time.time()), "model": req.model or self.name,
               "choices": choices, "usage": msgspec.to_builtins(usage) if usage else None,
               "metrics": gen.metrics}
        return out, next_state

    # -- completions ------------------------------------------------------------------------

    def completion(self, req: DerenderCompletionRequest) -> dict[str, Any]:
        if not req.generate_responses:
            raise BadRequestError("generate_responses must not be empty")
        cmpl = req.completion_request
        choices: list[dict[str, Any]] = []
        total_prompt = total_completion = 0
        for i, gen in enumerate(req.generate_responses):
            ids_override = req.prompt_token_ids[i] if req.prompt_token_ids is not None else None
            prompt = ids_override if ids_override is not None else gen.prompt_token_ids or []
            for c in gen.choices:
                if not c.token_ids:
                    raise BadRequestError(f"choice {c.index} in response {gen.request_id} has "
                                          "empty or null token_ids")
                text = self._text(c.token_ids, prompt, cmpl, [])
                lp = (msgspec.to_builtins(_completion_logprobs(self.decoder, c.logprobs, [], 0))
                      if c.logprobs is not None else None)
                choices.append({"index": len(choices), "text": text, "logprobs": lp,
                                "finish_reason": c.finish_reason,
                                "stop_reason": c.stop_reason})
                total_completion += len(c.token_ids)
            total_prompt += req.prompt_tokens[i] if req.prompt_tokens is not None else 0
        first = req.generate_responses[0]
        kv = first.kv_transfer_params
        if any(g.kv_transfer_params != kv for g in req.generate_responses[1:]):
            kv = None
        return {"id": first.request_id, "object": "text_completion",
                "created": int(time.time()), "model": req.model or self.name,
                "choices": choices,
                "usage": msgspec.to_builtins(_usage(total_prompt, total_completion)),
                "kv_transfer_params": kv,
                # Metrics describe one prompt (vLLM's rule).
                "metrics": first.metrics if len(req.generate_responses) == 1 else None}

    def completion_stream(self, req: DerenderCompletionStreamRequest
                          ) -> tuple[dict[str, Any], DerenderStreamState]:
        gen = req.generate_chunk
        if len(gen.choices) > 1:
            raise BadRequestError(
                "derender_completion_stream expects at most one choice per chunk")
        state = req.stream_state or DerenderStreamState()
        prompt = req.prompt_token_ids if req.prompt_token_ids is not None \
            else gen.prompt_token_ids or []
        choices: list[dict[str, Any]] = []
        offset = state.logprob_text_offset
        ctx = list(state.logprob_context_token_ids)
        for c in gen.choices:
            ids = c.token_ids or []
            text = self._text(ids, prompt, req.completion_request, ctx)
            lp = (msgspec.to_builtins(_completion_logprobs(self.decoder, c.logprobs, ctx, offset))
                  if c.logprobs is not None else None)
            choices.append({"index": c.index, "text": text, "logprobs": lp,
                            "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})
            offset += len(text)
            ctx = (ctx + list(ids))[-CONTEXT:]
        usage = _stream_usage(gen.usage, req.prompt_tokens)
        chunk = {"id": gen.request_id, "object": "text_completion", "created": int(time.time()),
                 "model": req.model or self.name, "choices": choices,
                 "usage": msgspec.to_builtins(usage) if usage else None, "metrics": gen.metrics}
        return chunk, msgspec.structs.replace(state, logprob_text_offset=offset,
                                              logprob_context_token_ids=ctx)

    # -- shared -----------------------------------------------------------------------------

    def _factory(self, chat: ChatCompletionRequest | None, prompt: Sequence[int]
                 ) -> RequestParsers | None:
        if self.parsers is None or chat is None:
            return None
        return self.parsers.for_request(options_of(chat), prompt)

    def _spec(self, kind: str, request_id: str, model: str | None, n: int,
              chat: ChatCompletionRequest | CompletionRequest | None, prompt: Sequence[int],
              factory: RequestParsers | None, prompt_tokens: int | None) -> PipelineSpec:
        # With a parser every token is decoded (vLLM's derender keeps special tokens for it),
        # but for vLLM's engine-based parsers, whose text holds only their markers.
        if factory is not None:
            skip = factory.drops_specials
        else:
            skip = chat.skip_special_tokens if chat is not None else True
        return PipelineSpec(kind=kind, request_id=request_id, model=model or self.name,
                            created=int(time.time()), prompt_tokens=prompt_tokens or 0,
                            n=max(n, 1), skip_special_tokens=skip,
                            include_stop_str_in_output=True, prompt_tail=tuple(prompt[-6:]))

    def _text(self, ids: Sequence[int], prompt: Sequence[int],
              cmpl: CompletionRequest | None, context: Sequence[int]) -> str:
        """The text of ``ids`` decoded after ``context`` (earlier ids of the same output)."""
        pipeline = Pipeline(self._spec(COMPLETION, "derender", None, 1, cmpl, prompt, None,
                                       None), self.decoder)
        if context:
            _replay(pipeline, list(context), [len(context)])
        chunk, _ = pipeline.feed(0, _output(list(ids), None, None)) if ids else (None, False)
        tail = pipeline.feed(0, _output([], "length", None))[0] if not context else None
        texts = [c.choices[0].text for c in (chunk, tail)
                 if isinstance(c, Completion) and c.choices]
        return "".join(texts)


def _output(ids: Sequence[int], finish: str | None, stop_reason: int | str | None
            ) -> EngineCoreOutput:
    out = EngineCoreOutput("derender", list(ids), stop_reason=stop_reason)
    if finish is not None:
        out.finish_reason = _FINISH.get(finish, FinishReason.ABORT)
    return out


def _replay(pipeline: Pipeline, ids: Sequence[int], lens: Sequence[int]) -> None:
    """Feed earlier chunks to rebuild the pipeline's state; their answers were sent before."""
    pos = 0
    for n in lens:
        pipeline.feed(0, _output(ids[pos:pos + n], None, None))
        pos += n


def _choice(chunk: Any, index: int) -> dict[str, Any]:
    if isinstance(chunk, ChatCompletionChunk) and chunk.choices:
        built: dict[str, Any] = msgspec.to_builtins(chunk.choices[0])
        built["index"] = index
        built["delta"].pop("reasoning_content", None)  # vLLM's derender sends ``reasoning``
        return built
    return {"index": index, "delta": {}, "logprobs": None, "finish_reason": None}


def _usage(prompt: int, completion: int) -> Usage:
    return Usage(prompt_tokens=prompt, total_tokens=prompt + completion,
                 completion_tokens=completion)


def _stream_usage(usage: dict[str, Any] | None, prompt_tokens: int | None) -> Usage | None:
    if usage is None:
        return None
    pt = prompt_tokens if prompt_tokens is not None else int(usage.get("prompt_tokens") or 0)
    ct = int(usage.get("completion_tokens") or 0)
    return _usage(pt, ct)


def _token(decoder: TokenDecoder, token_id: int, context: Sequence[int]) -> str:
    """A token's text as vLLM shows it in logprobs: decoded alone, and where that ends in
    U+FFFD, repaired from up to four preceding sampled ids (``_correct_decoded_token``)."""
    text = decoder.token_text(token_id)
    if not text.endswith("\ufffd"):
        return text
    decode = decoder.tokenizer.decode
    for n in range(1, min(len(context), CONTEXT) + 1):
        ctx = list(context[-n:])
        full = decode(ctx + [token_id], skip_special_tokens=False)
        if full.endswith("\ufffd"):
            continue
        clean = len(ctx)
        for j in range(len(ctx) - 1, -1, -1):
            if decoder.token_text(ctx[j]).endswith("\ufffd"):
                clean = j
            else:
                break
        prefix = decode(ctx[:clean], skip_special_tokens=False) if clean else ""
        if full.startswith(prefix):
            return full[len(prefix):]
        common = 0
        for a, b in zip(prefix, full, strict=False):
            if a != b:
                break
            common += 1
        return full[common:]
    return ""


def _chat_logprobs(decoder: TokenDecoder, lp: GenerateLogprobs, context: Sequence[int]
                   ) -> ChatLogprobs:
    if lp.content is None:
        return ChatLogprobs(None)
    ctx = list(context)
    out = []
    for entry in lp.content:
        token = _token(decoder, entry.token_id, ctx)
        tops = [ChatTopLogprob(t, top.logprob, list(t.encode("utf-8", "replace")))
                for top in entry.top_logprobs for t in (_token(decoder, top.token_id, ctx),)]
        out.append(ChatLogprobsContent(token, entry.logprob,
                                       list(token.encode("utf-8", "replace")), tops))
        ctx.append(entry.token_id)
    return ChatLogprobs(out)


def _completion_logprobs(decoder: TokenDecoder, lp: GenerateLogprobs, context: Sequence[int],
                         offset: int) -> CompletionLogprobs | None:
    chat = _chat_logprobs(decoder, lp, context)
    if chat.content is None or isinstance(chat.content, msgspec.Raw):
        return None
    lps = CompletionLogprobs([], [], [], [])
    for entry in chat.content:
        lps.text_offset.append(offset)
        lps.tokens.append(entry.token)
        lps.token_logprobs.append(entry.logprob)
        lps.top_logprobs.append({t.token: t.logprob for t in entry.top_logprobs} or None)
        offset += len(entry.token)
    return lps
