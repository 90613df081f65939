"""What an OpenAI answer shows besides the generated text, read from the request as vLLM reads it.

Each function returns ``PipelineSpec`` fields for one request (router/front/handlers.py builds
the spec): the echo, the prompt's ids, text and logprobs, the logprob spelling, usage options
and the streaming interval, with the server-wide defaults of ``RouterConfig.frontend``. The
response id a client's ``x-request-id`` header sets is here too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from render.protocol import ChatCompletionRequest, CompletionRequest, ContentPart, GenerateRequest
from render.renderer import Renderer
from router.config import Frontend
from serving.errors import InvalidJSONError

Headers = Iterable[tuple[bytes, bytes]]

UNSUPPORTED_MEDIA = ("1 validation error:\n  Unsupported Media Type: Only 'application/json' "
                     "is allowed")


def check_json(headers: Headers) -> None:
    """vLLM's ``validate_json_request``: a body not declared ``application/json`` is refused."""
    for name, value in headers:
        if name == b"content-type":
            if value.split(b";", 1)[0].strip().lower() == b"application/json":
                return
            break
    raise InvalidJSONError(UNSUPPORTED_MEDIA)


def header_request_id(headers: Headers) -> str | None:
    """The client's ``x-request-id``, which vLLM takes for the answer's id (serving/guard.py
    has refused an unfit one already)."""
    for name, value in headers:
        if name == b"x-request-id" and value:
            return value.decode("ascii")
    return None


def session_id(req: ChatCompletionRequest | CompletionRequest, headers: Headers) -> str | None:
    """vLLM's session id for the engine: the request's, else ``x-session-id``, else
    ``vllm_xargs["session_id"]``."""
    if req.session_id:
        return req.session_id
    for name, value in headers:
        if name == b"x-session-id" and value:
            return value.decode("latin-1")
    xargs = req.vllm_xargs or {}
    sid = xargs.get("session_id")
    return sid if isinstance(sid, str) and sid else None


def header_priority(headers: Headers) -> int | None:
    """``x-vllm-priority``, which wins over the request's ``priority`` in vLLM (ignored when not
    an integer)."""
    for name, value in headers:
        if name == b"x-vllm-priority":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def usage_options(gen: GenerateRequest, frontend: Frontend) -> dict[str, Any]:
    """vLLM's ``should_include_usage``: per-chunk usage only with the final one."""
    if frontend.enable_force_include_usage:
        include, continuous = True, True
    else:
        opts = gen.stream_options
        include = bool(opts and opts.include_usage)
        continuous = include and bool(opts and opts.continuous_usage_stats)
    return {"include_usage": include, "continuous_usage": continuous,
            "usage_details": frontend.enable_prompt_tokens_details}


def _common(req: ChatCompletionRequest | CompletionRequest, gen: GenerateRequest,
            frontend: Frontend) -> dict[str, Any]:
    sp = gen.sampling_params
    as_ids = req.return_tokens_as_token_ids
    out = {
        **usage_options(gen, frontend),
        "return_token_ids": bool(req.return_token_ids),
        "tokens_as_ids": frontend.return_tokens_as_token_ids if as_ids is None else as_ids,
        "prompt_logprobs": sp.prompt_logprobs,
        "stream_interval": (sp.stream_interval or 1) if req.stream else 1,
    }
    if sp.logprob_token_ids:
        # vLLM shows a row's every candidate: the sampled token and the asked ids.
        out.update(logprobs=len(sp.logprob_token_ids), logprobs_every=True)
    return out


def chat_options(req: ChatCompletionRequest, gen: GenerateRequest, renderer: Renderer,
                 frontend: Frontend) -> dict[str, Any]:
    """A chat answer's: its role, the echoed last message, the prompt's ids and text."""
    role = "assistant" if req.add_generation_prompt else req.messages[-1].role
    out = _common(req, gen, frontend)
    out["role"] = role
    if req.echo and req.messages and req.messages[-1].role == role:
        out["echo"] = _text(req.messages[-1].content) or None
    if req.return_token_ids:
        out["prompt_token_ids"] = list(gen.token_ids)
    if req.return_prompt_text:
        out["prompt_text"] = renderer.prompt_text(req, gen.token_ids)
    return out


def completion_options(req: CompletionRequest, gen: GenerateRequest, prompt: str | None,
                       frontend: Frontend) -> dict[str, Any]:
    """One prompt's completions answer: the echo (the prompt text as the client sent it; none
    with return_token_ids, as vLLM) and the prompt's ids."""
    out = _common(req, gen, frontend)
    if req.echo or req.return_token_ids:
        out["prompt_token_ids"] = list(gen.token_ids)  # in each choice's first chunk
    if req.echo:
        out["echo"] = "" if req.return_token_ids else prompt
        out["echo_only"] = req.max_tokens == 0
        out["prompt_ids"] = list(gen.token_ids)
    return out


def completion_prompts(req: CompletionRequest, gens: list[GenerateRequest],
                       renderer: Renderer) -> list[str]:
    """Each prompt's text as vLLM echoes it: as sent, or its token ids decoded."""
    prompt = req.prompt
    texts = [prompt] if isinstance(prompt, str) else list(prompt or [])
    out = []
    for i, gen in enumerate(gens):
        text = texts[i] if i < len(texts) else None
        kept = isinstance(text, str) and req.truncate_prompt_tokens is None
        out.append(text if kept and isinstance(text, str) else
                   renderer.tokenizer.decode(gen.token_ids, skip_special_tokens=False))
    return out


def _text(content: object) -> str:
    """A message's content as vLLM's conversation holds it: text parts joined by newlines."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        return "\n".join(p if isinstance(p, str) else p.text or ""
                         for p in content if isinstance(p, str | ContentPart))
    return ""
