"""vLLM's SamplingParams checks: one validation for render and the router's token-in path.

Two stages, as in vLLM 0.32. ``check_sampling`` mirrors ``SamplingParams._verify_args`` (run as
the params are built, before any answer starts); ``check_engine_input`` mirrors the input
processor's ``SamplingParams.verify`` and prompt checks (run as vLLM hands the request to its
engine: a streamed answer has started by then, so its refusals are ``InputProcessorError``s,
which the router sends a stream as an SSE error event). Messages, and the parameter each names,
are vLLM's (``VLLMValidationError`` appends ``(parameter=..., value=...)`` where it names them),
so the same bad value gets the same answer from vLLM, from render and from the router's
token-in path; ``where`` prefixes the parameter with where the field sits in the body.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from render.errors import BadRequestError, InputProcessorError, vllm_message
from wire.sampling import SamplingParams

# Render's requests cap ``n`` at decode time too (render/protocol.py); token-in requests here.
MAX_N = 1024


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Bounds on the work one request may ask for (docs/operations.md, "Request limits").

    ``max_logprobs`` is vLLM's (``--max-logprobs``, default 20, -1: the whole vocabulary); keep it
    equal to the engines'. vLLM has no bound on ``n`` or on stop strings: those are the router's,
    because every choice and every stop string costs work per output token.
    """

    max_n: int = MAX_N
    max_logprobs: int = 20
    max_stop_strings: int = 64
    max_stop_bytes: int = 16 * 1024  # UTF-8 bytes of all stop strings together
    # n x max_tokens x (logprobs + 1): the token and logprob entries one answer may carry (a
    # collected answer holds them all; ~100 bytes of JSON each). 0: no bound.
    max_output_entries: int = 1 << 24


DEFAULT_LIMITS = RequestLimits()
# vLLM's bound on ``logprob_token_ids`` (sampling_params.py), not configurable there either.
MAX_LOGPROB_TOKEN_IDS = 128
# Below this temperature vLLM samples greedily.
SAMPLING_EPS = 1e-5

# (message, parameter, value): one refusal, worded as vLLM's.
Refusal = tuple[str, str | None, object]


def check_sampling(sp: SamplingParams, where: str = "",
                   limits: RequestLimits = DEFAULT_LIMITS) -> None:
    """Raise a 400 for the first field ``SamplingParams._verify_args`` would refuse, or beyond
    ``limits``."""
    bad = _first_bad(sp, limits)
    if bad is not None:
        raise _error(BadRequestError, bad, where)


def check_engine_input(sp: SamplingParams, prompt_len: int, *, vocab_size: int,
                       max_model_len: int, prompt_ids: Sequence[int] = (), where: str = "",
                       limits: RequestLimits = DEFAULT_LIMITS,
                       reasoning: bool | None = None) -> None:
    """Raise an ``InputProcessorError`` for the first thing vLLM's input processor would refuse:
    logprob counts over ``max_logprobs``, token ids outside the model's vocabulary (the logits'
    width, ``vocab_size``; ``prompt_ids``: a prompt given as ids), a prompt that leaves no room
    in the context, a thinking budget without a reasoning parser (``reasoning`` False; None:
    not known here, as in render, which leaves it to the router)."""
    bad = _first_bad_input(sp, prompt_len, prompt_ids, vocab_size, limits, reasoning)
    if bad is None and prompt_len >= max_model_len:
        longer = prompt_len > max_model_len
        kind = "is longer than" if longer else (
            "plus the number of requested output tokens (at least 1) is longer than")
        bad = (f"The decoder prompt (length {prompt_len}) {kind} the maximum model length of "
               f"{max_model_len}. Make sure that `max_model_len` is no smaller than the number "
               "of text tokens" + ("." if longer else " (prompt + requested output tokens)."),
               None, None)
    if bad is not None:
        raise _error(InputProcessorError, bad, where)


def _error(cls: type[BadRequestError], bad: Refusal, where: str) -> BadRequestError:
    message, param, value = bad
    return cls(vllm_message(message, param, value), None if param is None else where + param)


def _first_bad(sp: SamplingParams, limits: RequestLimits) -> Refusal | None:
    bad = _first_bad_part(sp)
    if bad is not None:
        return bad
    if sp.n < 1:
        return f"n must be at least 1, got {sp.n}.", None, None
    if sp.n > limits.max_n:
        return f"n must be at most {limits.max_n}, got {sp.n}.", "n", None
    if sp.extra_args and not _ints_fit(sp.extra_args):
        return "extra_args integers must be between -2**63 and 2**64 - 1.", "extra_args", None
    for name, value in (("presence_penalty", sp.presence_penalty),
                        ("frequency_penalty", sp.frequency_penalty)):
        if not -2.0 <= value <= 2.0:  # NaN fails too
            return f"{name} must be in [-2, 2], got {value}.", None, None
    if not math.isfinite(sp.repetition_penalty):
        return (f"repetition_penalty must be a finite number, got {sp.repetition_penalty}.",
                None, None)
    if sp.repetition_penalty <= 0.0:
        return (f"repetition_penalty must be greater than zero, got {sp.repetition_penalty}.",
                None, None)
    t = sp.temperature
    if not math.isfinite(t):
        return f"temperature must be a finite number, got {t}.", "temperature", t
    if t < 0.0:
        return f"temperature must be non-negative, got {t}.", "temperature", t
    if t > 2.0:
        return f"temperature must be in [0, 2], got {t}.", "temperature", t
    if not 0.0 < sp.top_p <= 1.0:
        return f"top_p must be in (0, 1], got {sp.top_p}.", "top_p", sp.top_p
    if sp.top_k < -1:  # -1 is accepted as "disabled", as 0
        return f"top_k must be 0 (disable), or at least 1, got {sp.top_k}.", None, None
    if not 0.0 <= sp.min_p <= 1.0:
        return f"min_p must be in [0, 1], got {sp.min_p}.", None, None
    bad = _first_bad_length_or_output(sp)
    if bad is not None:
        return bad
    if sp.temperature < SAMPLING_EPS and sp.n > 1:  # __post_init__'s _verify_greedy_sampling
        return f"n must be 1 when using greedy sampling, got {sp.n}.", None, None
    return _first_over_limit(sp, limits)


def _first_bad_part(sp: SamplingParams) -> Refusal | None:
    """What vLLM refuses as it builds the params' parts (``RepetitionDetectionParams``, the
    thinking budget). An engine decoding them refuses them too, and its input thread dies of
    it: these never reach one."""
    rd = sp.repetition_detection
    if rd is not None:
        if (rd.max_pattern_size < 0 or rd.min_pattern_size < 0
                or rd.min_pattern_size > rd.max_pattern_size):
            return ("max_pattern_size, min_pattern_size must be >=0, with min_pattern_size <= "
                    "max_pattern_size. Set both to 0 to disable repetitive pattern detection.",
                    None, None)
        if rd.max_pattern_size > 0 and rd.min_count < 2:
            return ("min_count must be >= 2 to detect repetitive patterns in engine output. If "
                    "you do not wish to detect repetitive patterns, set max_pattern_size to 0.",
                    None, None)
    budget = sp.thinking_token_budget
    if budget is not None and budget < -1:
        return ("`thinking_token_budget` must be a non-negative integer or -1 for unlimited.",
                "thinking_token_budget", budget)
    return None


def _ints_fit(value: object) -> bool:
    """Every integer in ``value`` (nested lists and maps, keys too) fits msgpack's 64 bits."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, int) and not isinstance(item, bool) and not (
                -(2**63) <= item < 2**64):
            return False
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return True


def _first_bad_length_or_output(sp: SamplingParams) -> Refusal | None:
    max_tokens = sp.max_tokens
    if max_tokens is not None and max_tokens < 1:
        return f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens
    if sp.min_tokens < 0:
        return f"min_tokens must be greater than or equal to 0, got {sp.min_tokens}.", None, None
    if max_tokens is not None and sp.min_tokens > max_tokens:
        return (f"min_tokens must be less than or equal to max_tokens={max_tokens}, got "
                f"{sp.min_tokens}.", None, None)
    if sp.stream_interval is not None and sp.stream_interval < 1:
        return (f"stream_interval must be at least 1, got {sp.stream_interval}.",
                "stream_interval", sp.stream_interval)
    for name, value in (("logprobs", sp.logprobs), ("prompt_logprobs", sp.prompt_logprobs)):
        if value is not None and value < -1:  # -1: every token's logprob
            return f"{name} must be non-negative or -1, got {value}.", name, value
    stop = [sp.stop] if isinstance(sp.stop, str) else sp.stop or []
    if any(not s for s in stop):
        return "stop cannot contain an empty string.", None, None
    if stop and not sp.detokenize:
        return ("stop strings are only supported when detokenize is True. Set detokenize=True "
                "to use stop."), None, None
    if sp.bad_words and any(not w for w in sp.bad_words):
        return f"bad_words cannot contain an empty string. Got bad_words={sp.bad_words}", None, None
    return None


def _first_over_limit(sp: SamplingParams, limits: RequestLimits) -> Refusal | None:
    """The router's own bounds (vLLM has none for these)."""
    entries_cap = limits.max_output_entries
    if entries_cap and sp.max_tokens is not None:
        # Logprobs past max_logprobs are vLLM's to refuse (check_engine_input), in its words.
        top = sp.logprobs if sp.logprobs and sp.logprobs > 0 else 0
        if limits.max_logprobs >= 0:
            top = min(top, limits.max_logprobs)
        per_token = 1 + top + len(sp.logprob_token_ids or ())
        entries = sp.n * sp.max_tokens * per_token
        if entries > entries_cap:
            return (f"n x max_tokens x (logprobs + 1) = {sp.n} x {sp.max_tokens} x {per_token} = "
                    f"{entries} exceeds max_output_entries ({entries_cap}): lower n, max_tokens "
                    "or logprobs.", "n", None)
    stop = [sp.stop] if isinstance(sp.stop, str) else sp.stop or []
    if len(stop) > limits.max_stop_strings:
        return (f"stop may hold at most {limits.max_stop_strings} strings (max_stop_strings), "
                f"got {len(stop)}.", "stop", None)
    total = sum(len(s.encode("utf-8", "surrogatepass")) for s in stop)
    if total > limits.max_stop_bytes:
        return (f"stop strings may total at most {limits.max_stop_bytes} bytes "
                f"(max_stop_bytes), got {total}.", "stop", None)
    return None


def _first_bad_input(sp: SamplingParams, prompt_len: int, prompt_ids: Sequence[int],
                     vocab: int, limits: RequestLimits, reasoning: bool | None
                     ) -> Refusal | None:
    """``SamplingParams.verify`` (logprobs, logit_bias, stop_token_ids, allowed_token_ids), the
    input processor's own checks, then the prompt's token ids."""
    bad = _first_bad_logprobs(sp, vocab, limits.max_logprobs)
    if bad is not None:
        return bad
    for name, ids in (("logit_bias", list(sp.logit_bias or ())),
                      ("stop_token_ids", sp.stop_token_ids or ())):
        oov = [t for t in ids if not 0 <= t < vocab]
        if oov:
            return (f"token_id(s) {oov} in {name} contain out-of-vocab token ids. Vocabulary "
                    f"size: {vocab}", name, oov)
    allowed = sp.allowed_token_ids
    if allowed is not None:
        if not allowed:
            return "allowed_token_ids is not None and empty!", "allowed_token_ids", allowed
        oov = [t for t in allowed if not 0 <= t < vocab]
        if oov:
            return "allowed_token_ids contains out-of-vocab token id!", "allowed_token_ids", oov
    if sp.thinking_token_budget is not None and reasoning is False:
        return ("thinking_token_budget is set but reasoning_config is not configured. Please "
                "set --reasoning-parser and/or --reasoning-config to use thinking_token_budget.",
                None, None)
    if not 0 <= sp.routed_experts_prompt_start <= prompt_len:
        return (f"routed_experts_prompt_start must be between 0 and the prompt length "
                f"({prompt_len}), inclusive.", "routed_experts_prompt_start",
                sp.routed_experts_prompt_start)
    for t in prompt_ids:
        if not 0 <= t < vocab:
            return f"Token id {t} is out of vocabulary", None, None
    return None


def _first_bad_logprobs(sp: SamplingParams, vocab: int, max_logprobs: int) -> Refusal | None:
    """``SamplingParams._validate_logprobs``: -1 means the whole vocabulary, on both sides."""
    cap = vocab if max_logprobs == -1 else max_logprobs
    if sp.logprobs:
        wanted = vocab if sp.logprobs == -1 else sp.logprobs
        if wanted > cap:
            return (f"Requested sample logprobs of {wanted}, which is greater than max "
                    f"allowed: {cap}", "logprobs", wanted)
    ids = sp.logprob_token_ids
    if ids is not None:
        if len(ids) > MAX_LOGPROB_TOKEN_IDS:
            return (f"Requested logprob_token_ids of length {len(ids)}, which is greater than "
                    f"max allowed: {MAX_LOGPROB_TOKEN_IDS}", "logprob_token_ids", len(ids))
        oov = [t for t in ids if not 0 <= t < vocab]
        if oov:
            return (f"token_id(s) {oov} in logprob_token_ids contain out-of-vocab token ids. "
                    f"Vocabulary size: {vocab}", "logprob_token_ids", oov)
        if sp.logprobs is not None and sp.logprobs != len(ids):
            return (f"When both logprobs and logprob_token_ids are set, logprobs must equal "
                    f"len(logprob_token_ids). Got logprobs={sp.logprobs}, "
                    f"len(logprob_token_ids)={len(ids)}.", "logprob_token_ids", len(ids))
    if sp.prompt_logprobs:
        wanted = vocab if sp.prompt_logprobs == -1 else sp.prompt_logprobs
        if wanted > cap:
            return (f"Requested prompt logprobs of {wanted}, which is greater than max "
                    f"allowed: {cap}", "prompt_logprobs", wanted)
    return None
