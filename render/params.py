"""OpenAI/vLLM request fields -> ``wire.sampling.SamplingParams``, as vLLM's frontend builds them.

Follows vLLM 0.32: ``TokenizeParams`` (context checks), ``get_max_tokens`` (max_tokens defaults to
the remaining context, and is cut to it),
``ChatCompletionRequest/CompletionRequest.to_sampling_params`` (request value, else the
model's generation_config default, else OpenAI's), ``SamplingParams.__post_init__`` (range checks,
stop as a list, greedy resets) and the engine-side ``update_from_generation_config`` that fills
``_eos_token_id``/``_all_stop_token_ids``/``stop_token_ids``: an engine fed our map stops where
vLLM's own frontend would make it stop. Stop strings are kept (vllm-rs drops them).
"""

from __future__ import annotations

from typing import Any

from render.errors import BadRequestError, ContextLengthError, vllm_message
from render.protocol import ChatCompletionRequest, CompletionRequest
from render.sampling_checks import DEFAULT_LIMITS, SAMPLING_EPS, RequestLimits, check_sampling
from wire.sampling import (
    OUTPUT_DELTA,
    OUTPUT_FINAL_ONLY,
    SamplingParams,
    StructuredOutputsParams,
)

# Keys vLLM takes from generation_config.json (``ModelConfig.get_diff_sampling_param``).
GENERATION_DEFAULT_KEYS = (
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "max_new_tokens",
)
_OPENAI_DEFAULTS: dict[str, float | int] = {
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
}
_MAX_TEMP = 1e-2


def default_sampling_params(generation_config: dict[str, Any]) -> dict[str, Any]:
    """The model's sampling defaults (``max_new_tokens`` renamed ``max_tokens``)."""
    if not any(k in generation_config for k in GENERATION_DEFAULT_KEYS):
        return {}
    out = {
        k: generation_config[k]
        for k in GENERATION_DEFAULT_KEYS
        if generation_config.get(k) is not None
    }
    if "max_new_tokens" in out:
        out["max_tokens"] = out.pop("max_new_tokens")
    return out


def check_context(max_model_len: int, requested: int | None, param: str,
                  truncate_prompt_tokens: int | None) -> None:
    """vLLM's ``TokenizeParams`` checks, made before the prompt is tokenized: neither the output
    budget nor the truncation may exceed the context."""
    if requested is not None and requested > max_model_len:
        raise ContextLengthError(vllm_message(
            f"{param}={requested} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.", param, requested), param)
    keep = truncate_prompt_tokens
    if keep is not None and keep > max_model_len:
        raise ContextLengthError(vllm_message(
            f"truncate_prompt_tokens={keep} cannot be greater than max_model_len = "
            f"{max_model_len}. Please request a smaller truncation size.",
            "truncate_prompt_tokens", keep), "truncate_prompt_tokens")


def check_prompt_len(max_model_len: int, prompt_len: int, from_text: bool) -> None:
    """vLLM's ``_token_len_check``. vLLM tokenizes text with ``max_length = max_model_len + 1``
    (a prompt past the context is not tokenized whole), so a text prompt's count stops there:
    the message then says "at least"."""
    if prompt_len <= max_model_len:
        return
    count = min(prompt_len, max_model_len + 1) if from_text else prompt_len
    qualifier = "at least " if count == max_model_len + 1 else ""
    raise ContextLengthError(vllm_message(
        f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
        f"contains {qualifier}{count} input tokens, which exceeds this limit even without any "
        "output tokens. Please reduce the length of the input prompt.", "input_tokens", count),
        "input_tokens")


def max_tokens_for(max_model_len: int, requested: int | None, prompt_len: int,
                   defaults: dict[str, Any]) -> int:
    """vLLM's ``get_max_tokens``: the request's (or the model's default) output budget, never
    past the room the prompt leaves in the context (asking for more is no error: generation
    stops at the context's end). 0 when the prompt fills the context (SamplingParams refuses)."""
    remaining = max_model_len - prompt_len
    fallback = requested if requested is not None else defaults.get("max_tokens")
    return min(v for v in (remaining, fallback) if v is not None)


def _logit_bias(raw: dict[str, float] | None) -> dict[int, float] | None:
    if raw is None:
        return None
    out: dict[int, float] = {}
    invalid = []
    for key, bias in raw.items():
        try:
            out[int(key)] = min(100.0, max(-100.0, bias))
        except ValueError:
            invalid.append(key)
    if invalid:
        raise BadRequestError(vllm_message(
            f"logit_bias contains key(s) that cannot be converted to integer token IDs: "
            f"{invalid!r}", "logit_bias", invalid), "logit_bias")
    return out


def build_sampling_params(
    req: ChatCompletionRequest | CompletionRequest,
    *,
    max_tokens: int,
    defaults: dict[str, Any],
    generation_config: dict[str, Any],
    eos_token_id: int | None,
    limits: RequestLimits = DEFAULT_LIMITS,
    structured_outputs: StructuredOutputsParams | None = None,
) -> SamplingParams:
    """The SamplingParams vLLM's OpenAI protocol builds for this request (``structured_outputs``:
    the request's constraint, render.structured's ``from_request``); the steps of vLLM's input
    processor that need the tokenizer are ``Renderer.engine_params``'."""
    values = {
        name: (v if (v := getattr(req, name)) is not None else defaults.get(name, d))
        for name, d in _OPENAI_DEFAULTS.items()
    }
    logprobs, prompt_logprobs, final_max = _logprob_fields(req, max_tokens)
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    temperature = float(values["temperature"])
    if 0 < temperature < _MAX_TEMP:
        temperature = _MAX_TEMP
    sp = SamplingParams(
        n=req.n if req.n is not None else 1,
        presence_penalty=float(values["presence_penalty"]),
        frequency_penalty=float(values["frequency_penalty"]),
        repetition_penalty=float(values["repetition_penalty"]),
        temperature=temperature,
        watermarking=req.watermarking,
        top_p=float(values["top_p"]),
        top_k=int(values["top_k"]),
        min_p=float(values["min_p"]),
        seed=None if req.seed == -1 else req.seed,
        stop=stop,
        stop_token_ids=_stop_token_ids(req, defaults),
        ignore_eos=req.ignore_eos,
        max_tokens=final_max,
        min_tokens=req.min_tokens,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        logprob_token_ids=req.logprob_token_ids or None,
        skip_special_tokens=req.skip_special_tokens,
        spaces_between_special_tokens=req.spaces_between_special_tokens,
        include_stop_str_in_output=req.include_stop_str_in_output,
        output_kind=OUTPUT_DELTA if req.stream else OUTPUT_FINAL_ONLY,
        stream_interval=req.stream_interval,
        structured_outputs=structured_outputs,
        logit_bias=_logit_bias(req.logit_bias),
        allowed_token_ids=req.allowed_token_ids,
        extra_args=_extra_args(req),
        bad_words=list(dict.fromkeys(req.bad_words or [])),
        skip_clone=True,
        repetition_detection=req.repetition_detection,
        # -1 is unlimited: no budget (vLLM's validate_thinking_token_budget).
        thinking_token_budget=(None if req.thinking_token_budget == -1
                               else req.thinking_token_budget),
        routed_experts_prompt_start=req.routed_experts_prompt_start,
    )
    check_sampling(sp, limits=limits)
    _post_init(sp)
    _fill_stop_ids(sp, generation_config, eos_token_id)
    return sp


def _logprob_fields(req: ChatCompletionRequest | CompletionRequest, max_tokens: int
                    ) -> tuple[int | None, int | None, int]:
    """(logprobs, prompt_logprobs, max_tokens) as chat and completions requests name them."""
    if isinstance(req, ChatCompletionRequest):
        top = req.top_logprobs or 0  # null is 0 (vLLM's TopLogprobsParam)
        logprobs = top if req.logprobs and not req.logprob_token_ids else None
        prompt_logprobs = req.prompt_logprobs
        if prompt_logprobs is None and req.echo:
            prompt_logprobs = top
        return logprobs, prompt_logprobs, max_tokens
    logprobs = None if req.logprob_token_ids else req.logprobs
    prompt_logprobs = req.prompt_logprobs
    if prompt_logprobs is None and req.echo:
        prompt_logprobs = req.logprobs
    return logprobs, prompt_logprobs, 1 if (req.echo and req.max_tokens == 0) else max_tokens


def _stop_token_ids(req: ChatCompletionRequest | CompletionRequest,
                    defaults: dict[str, Any]) -> list[int]:
    """The request's stop token ids, then the model's default ones, each once."""
    return list(dict.fromkeys([*(req.stop_token_ids or []),
                               *(defaults.get("stop_token_ids") or [])]))


def _extra_args(req: ChatCompletionRequest | CompletionRequest) -> dict[str, Any] | None:
    extra_args: dict[str, Any] = dict(req.vllm_xargs or {})
    if req.kv_transfer_params:
        extra_args["kv_transfer_params"] = req.kv_transfer_params
    if req.ec_transfer_params:
        extra_args["ec_transfer_params"] = req.ec_transfer_params
    return extra_args or None


def _post_init(sp: SamplingParams) -> None:
    """The rest of ``SamplingParams.__post_init__`` once the checks passed."""
    if sp.stop and not sp.include_stop_str_in_output:
        sp.output_text_buffer_length = max(len(s) for s in sp.stop) - 1
    if sp.temperature < SAMPLING_EPS:
        sp.top_p, sp.top_k, sp.min_p = 1.0, 0, 0.0
    sp.skip_reading_prefix_cache = sp.prompt_logprobs is not None


def _fill_stop_ids(
    sp: SamplingParams, generation_config: dict[str, Any], eos_token_id: int | None
) -> None:
    """``SamplingParams.update_from_generation_config``: what makes an engine stop on EOS."""
    assert sp.stop_token_ids is not None
    stop_all = dict.fromkeys(sp.stop_token_ids)
    if not sp.ignore_eos:
        sp._eos_token_id = eos_token_id
    if eos_token_id is not None:
        stop_all[eos_token_id] = None
    eos_ids = generation_config.get("eos_token_id")
    if eos_ids is not None:
        extra = dict.fromkeys([eos_ids] if isinstance(eos_ids, int) else eos_ids)
        extra.pop(eos_token_id, None)
        if extra:
            stop_all.update(extra)
            if not sp.ignore_eos:
                sp.stop_token_ids = list(dict.fromkeys([*extra, *sp.stop_token_ids]))
    sp._all_stop_token_ids = sorted(stop_all)
