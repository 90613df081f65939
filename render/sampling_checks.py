"""vLLM's SamplingParams range checks: one validation for render and the router's token-in path.

Mirrors ``SamplingParams._verify_args`` (vLLM 0.32), the checks vLLM runs on every SamplingParams
whichever frontend built it, with its messages. Render runs it on the params it maps from an
OpenAI request, the router on the params a token-in (``/inference/v1/generate``) request carries,
so the same bad value gets the same 400 on both paths; only the ``param`` differs, naming where
the field sits in each body.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from render.errors import BadRequestError
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


def check_sampling(sp: SamplingParams, where: str = "",
                   limits: RequestLimits = DEFAULT_LIMITS) -> None:
    """Raise a 400 for the first field vLLM would refuse, or beyond ``limits``; ``where``
    prefixes the param named."""
    bad = _first_bad(sp, limits)
    if bad is not None:
        message, param = bad
        raise BadRequestError(message, where + param)


def _first_bad(sp: SamplingParams, limits: RequestLimits) -> tuple[str, str] | None:
    if sp.n < 1:
        return f"n must be at least 1, got {sp.n}.", "n"
    if sp.n > limits.max_n:
        return f"n must be at most {limits.max_n}, got {sp.n}.", "n"
    for name, value in (("presence_penalty", sp.presence_penalty),
                        ("frequency_penalty", sp.frequency_penalty)):
        if not -2.0 <= value <= 2.0:  # NaN fails too
            return f"{name} must be in [-2, 2], got {value}.", name
    if not math.isfinite(sp.repetition_penalty):
        return (f"repetition_penalty must be a finite number, got {sp.repetition_penalty}.",
                "repetition_penalty")
    if sp.repetition_penalty <= 0.0:
        return (f"repetition_penalty must be greater than zero, got {sp.repetition_penalty}.",
                "repetition_penalty")
    if not math.isfinite(sp.temperature):
        return f"temperature must be a finite number, got {sp.temperature}.", "temperature"
    if sp.temperature < 0.0:
        return f"temperature must be non-negative, got {sp.temperature}.", "temperature"
    if sp.temperature > 2.0:
        return f"temperature must be in [0, 2], got {sp.temperature}.", "temperature"
    if not 0.0 < sp.top_p <= 1.0:
        return f"top_p must be in (0, 1], got {sp.top_p}.", "top_p"
    if sp.top_k < -1:  # -1 is accepted as "disabled", as 0
        return f"top_k must be 0 (disable), or at least 1, got {sp.top_k}.", "top_k"
    if not 0.0 <= sp.min_p <= 1.0:
        return f"min_p must be in [0, 1], got {sp.min_p}.", "min_p"
    if sp.temperature < SAMPLING_EPS and sp.n > 1:  # __post_init__'s _verify_greedy_sampling
        return f"n must be 1 when using greedy sampling, got {sp.n}.", "n"
    return _first_bad_length_or_output(sp) or _first_over_limit(sp, limits)


def _first_over_limit(sp: SamplingParams, limits: RequestLimits) -> tuple[str, str] | None:
    """vLLM's ``_validate_logprobs`` and the router's stop-string bounds."""
    cap = limits.max_logprobs
    for name, kind, value in (("logprobs", "sample", sp.logprobs),
                              ("prompt_logprobs", "prompt", sp.prompt_logprobs)):
        if value and cap != -1 and (value == -1 or value > cap):
            shown = "-1 (the whole vocabulary)" if value == -1 else str(value)
            return (f"Requested {kind} logprobs of {shown}, which is greater than max "
                    f"allowed: {cap}", name)
    ids = sp.logprob_token_ids
    if ids is not None and len(ids) > MAX_LOGPROB_TOKEN_IDS:
        return (f"Requested logprob_token_ids of length {len(ids)}, which is greater than max "
                f"allowed: {MAX_LOGPROB_TOKEN_IDS}", "logprob_token_ids")
    entries_cap = limits.max_output_entries
    if entries_cap and sp.max_tokens is not None:
        per_token = 1 + (sp.logprobs if sp.logprobs and sp.logprobs > 0 else 0) + len(
            sp.logprob_token_ids or ())
        entries = sp.n * sp.max_tokens * per_token
        if entries > entries_cap:
            return (f"n x max_tokens x (logprobs + 1) = {sp.n} x {sp.max_tokens} x {per_token} = "
                    f"{entries} exceeds max_output_entries ({entries_cap}): lower n, max_tokens "
                    "or logprobs.", "n")
    stop = [sp.stop] if isinstance(sp.stop, str) else sp.stop or []
    if len(stop) > limits.max_stop_strings:
        return (f"stop may hold at most {limits.max_stop_strings} strings (max_stop_strings), "
                f"got {len(stop)}.", "stop")
    total = sum(len(s.encode("utf-8", "surrogatepass")) for s in stop)
    if total > limits.max_stop_bytes:
        return (f"stop strings may total at most {limits.max_stop_bytes} bytes "
                f"(max_stop_bytes), got {total}.", "stop")
    return None


def _first_bad_length_or_output(sp: SamplingParams) -> tuple[str, str] | None:
    max_tokens = sp.max_tokens
    if max_tokens is not None and max_tokens < 1:
        return f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens"
    if sp.min_tokens < 0:
        return (f"min_tokens must be greater than or equal to 0, got {sp.min_tokens}.",
                "min_tokens")
    if max_tokens is not None and sp.min_tokens > max_tokens:
        return (f"min_tokens must be less than or equal to max_tokens={max_tokens}, got "
                f"{sp.min_tokens}.", "min_tokens")
    if sp.stream_interval is not None and sp.stream_interval < 1:
        return (f"stream_interval must be at least 1, got {sp.stream_interval}.",
                "stream_interval")
    for name, value in (("logprobs", sp.logprobs), ("prompt_logprobs", sp.prompt_logprobs)):
        if value is not None and value < -1:  # -1: every token's logprob
            return f"{name} must be non-negative or -1, got {value}.", name
    stop = [sp.stop] if isinstance(sp.stop, str) else sp.stop or []
    if any(not s for s in stop):
        return "stop cannot contain an empty string.", "stop"
    if stop and not sp.detokenize:
        return ("stop strings are only supported when detokenize is True. Set detokenize=True "
                "to use stop.", "stop")
    if sp.bad_words and any(not w for w in sp.bad_words):
        return (f"bad_words cannot contain an empty string. Got bad_words={sp.bad_words}",
                "bad_words")
    return None
