"""vLLM's SamplingParams range checks: one validation for render and the router's token-in path.

Mirrors ``SamplingParams._verify_args`` (vLLM 0.32), the checks vLLM runs on every SamplingParams
whichever frontend built it, with its messages. Render runs it on the params it maps from an
OpenAI request, the router on the params a token-in (``/inference/v1/generate``) request carries,
so the same bad value gets the same 400 on both paths; only the ``param`` differs, naming where
the field sits in each body.
"""

from __future__ import annotations

import math

from render.errors import BadRequestError
from wire.sampling import SamplingParams

# Render's requests cap ``n`` at decode time (render/protocol.py); token-in requests here.
MAX_N = 1024
# Below this temperature vLLM samples greedily.
SAMPLING_EPS = 1e-5


def check_sampling(sp: SamplingParams, where: str = "") -> None:
    """Raise a 400 for the first field vLLM would refuse; ``where`` prefixes the param named."""
    bad = _first_bad(sp)
    if bad is not None:
        message, param = bad
        raise BadRequestError(message, where + param)


def _first_bad(sp: SamplingParams) -> tuple[str, str] | None:
    if sp.n < 1:
        return f"n must be at least 1, got {sp.n}.", "n"
    if sp.n > MAX_N:
        return f"n must be at most {MAX_N}, got {sp.n}.", "n"
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
    return _first_bad_length_or_output(sp)


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
