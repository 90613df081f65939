"""One request inside the sim engine: tokens, KV blocks, stop rules, pending per-output data."""

from __future__ import annotations

from typing import Any

from sim.prefix_cache import namespace_root
from wire.engine import EngineCoreEvent, EngineCoreRequest


class SimRequest:
    __slots__ = (
        "request_id",
        "client_index",
        "tokens",
        "num_prompt",
        "num_computed",
        "blocks",
        "num_cached_blocks",
        "hashes",
        "root",
        "max_tokens",
        "min_tokens",
        "eos",
        "stop_ids",
        "min_stop_ids",
        "logprobs",
        "logprob_ids",
        "prompt_logprobs",
        "key",
        "scripted",
        "events",
        "prefill_stats",
        "lora",
        "lora_id",
        "lora_name",
        "salt",
        "skip_prefix",
        "finished",
        "num_preemptions",
        "num_tokens",
        "stream",
        "stream_start",
        "echo",
        "echo_loop",
        "markov",
    )

    def __init__(self, req: EngineCoreRequest, key: int, max_model_len: int) -> None:
        assert req.prompt_token_ids is not None and req.sampling_params is not None
        sp = req.sampling_params
        self.request_id = req.request_id
        self.client_index = req.client_index
        self.tokens: list[int] = list(req.prompt_token_ids)
        self.num_prompt = len(self.tokens)
        # Kept in step with ``tokens``: read for every running request in every step.
        self.num_tokens = self.num_prompt
        self.num_computed = 0
        self.blocks: list[int] = []
        self.num_cached_blocks = 0
        self.hashes: list[int] = []
        lora = self.lora = req.lora_request
        self.lora_id = lora.lora_int_id if lora else None
        self.lora_name = lora.lora_name if lora else None
        self.salt = req.cache_salt or None
        self.root = namespace_root(self.lora_name, lora.lora_path if lora else None, self.salt)
        # vLLM's frontend always fills max_tokens; a bare client may leave it None.
        self.max_tokens = sp.max_tokens if sp.max_tokens is not None else max_model_len
        self.min_tokens = sp.min_tokens
        # check_stop stops on sampling_params.eos_token_id, i.e. the _eos_token_id field.
        self.eos = None if sp.ignore_eos else sp._eos_token_id
        self.stop_ids = frozenset(sp.stop_token_ids or ())
        # The min_tokens logits processor masks every stop id, EOS included.
        min_stop = set(sp._all_stop_token_ids) | self.stop_ids
        if self.eos is not None:
            min_stop.add(self.eos)
        self.min_stop_ids = frozenset(min_stop)
        # logprob_token_ids: each row holds the sampled token, then those ids (vLLM).
        self.logprob_ids: list[int] = list(sp.logprob_token_ids or ())
        self.logprobs = sp.logprobs if not self.logprob_ids else len(self.logprob_ids)
        self.prompt_logprobs = sp.prompt_logprobs
        self.key = key
        extra = sp.extra_args or {}
        scripted = extra.get("kvroute_sim_token_ids") if isinstance(extra, dict) else None
        self.scripted: list[int] = [int(t) for t in scripted] if isinstance(scripted, list) else []
        self.events: list[EngineCoreEvent] = []
        self.prefill_stats: dict[str, int] | None = None
        self.skip_prefix = bool(sp.skip_reading_prefix_cache) or sp.prompt_logprobs is not None
        self.finished = False
        self.num_preemptions = 0
        # Pre-drawn output ids for positions stream_start.. (see tokens.token_stream).
        self.stream: list[int] = []
        self.stream_start = 0
        # The echo answer (tokens.TokenTable.echo_ids), when the engine's output mode is "echo".
        self.echo: tuple[int, ...] = ()
        self.echo_loop = 0
        # The markov output's key and whether draws depend on the position (tokens.markov_key).
        self.markov: tuple[int, bool] | None = None

    def extra_keys(self, start_block: int, end_block: int) -> list[list[Any] | None]:
        """vLLM's per-block event extra keys: the LoRA name on every block, the salt on block 0."""
        out: list[list[Any] | None] = []
        for i in range(start_block, end_block):
            keys: list[Any] = []
            if self.lora_name is not None:
                keys.append(self.lora_name)
            if i == 0 and self.salt:
                keys.append(self.salt)
            out.append(keys or None)
        return out

    def take_events(self) -> list[EngineCoreEvent] | None:
        if not self.events:
            return None
        events, self.events = self.events, []
        return events
