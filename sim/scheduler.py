"""Sim engine scheduler: vLLM V1's continuous batching over the block pool, one step at a time.

A step is planned (``schedule``), takes simulated time, then completes (``finish``), as in vLLM's
busy loop: running requests first (decode, or the next chunk of a chunked prefill), preempting the
newest running request when blocks run out; then waiting requests while the token budget, the
sequence limit and free blocks allow, each starting from its longest cached prefix. A step costs
``step_time`` plus ``prefill_time_per_token`` per prompt token actually computed (cache hits are
free) and ``decode_time_per_seq`` per scheduled request. Sampling happens when a request's every
token has been computed.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.config import SimConfig
from sim.lora import LoRACache, LoRAError, worker_failure
from sim.prefix_cache import BlockPool, chain_hashes
from sim.request import SimRequest
from sim.tokens import (
    echo_stream,
    logprobs_row,
    markov_token,
    next_token,
    splitmix64,
    token_stream,
)
from wire.engine import (
    EngineCoreEvent,
    EngineCoreEventType,
    EngineCoreOutput,
    EngineCoreOutputs,
    FinishReason,
)

_U64 = float(1 << 64)
# Output ids drawn per request at a time (numpy-vectorised).
_STREAM_CHUNK = 32


@dataclass
class StepPlan:
    # (request, tokens computed this step, its preemption count when scheduled)
    scheduled: list[tuple[SimRequest, int, int]]
    duration: float


class Scheduler:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.block_size = config.block_size
        self.pool = BlockPool(
            config.num_gpu_blocks,
            config.block_size,
            enable_events=config.kv_events.enable_kv_cache_events,
        )
        self.requests: dict[str, SimRequest] = {}
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        # The worker's loaded adapters (None: LoRA off; then a request's adapter only names its
        # blocks' namespace, as on a vLLM engine started without --enable-lora).
        self.loras = (LoRACache(config.max_cpu_loras or config.max_loras, config.max_lora_rank)
                      if config.enable_lora else None)

    # ---- requests in and out ----

    def add(self, req: SimRequest, now: float) -> None:
        self.requests[req.request_id] = req
        self.waiting.append(req)
        if self.config.log_stats:
            req.events.append(EngineCoreEvent(EngineCoreEventType.QUEUED, now))

    def abort(self, request_ids: list[str]) -> None:
        """Drop requests silently: vLLM sends no output for an aborted request."""
        dropped = False
        for rid in request_ids:
            req = self.requests.pop(rid, None)
            if req is None:
                continue
            req.finished = dropped = True
            self._free(req)
        if dropped:
            self.waiting = deque(r for r in self.waiting if not r.finished)
            self.running = [r for r in self.running if not r.finished]

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _free(self, req: SimRequest) -> None:
        # Tail blocks first, so a shared prefix outlives the private tail in the LRU order.
        self.pool.free_blocks(req.blocks[::-1])
        req.blocks = []
        req.num_cached_blocks = 0

    # ---- planning ----

    def schedule(self, now: float) -> StepPlan:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[SimRequest, int, int]] = []
        prefill_tokens = 0
        preempted = False
        i = 0
        bs = self.block_size
        running = self.running
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.num_computed
            num_new = req.num_tokens - computed
            if num_new == 1 and (computed + 1) % bs and computed < len(req.blocks) * bs:
                # Decode within a partly filled block: nothing to allocate or announce.
                scheduled.append((req, 1, req.num_preemptions))
                if req.lora is not None and self.loras is not None:
                    self._load(req)
                budget -= 1
                i += 1
                continue
            num_new = min(num_new, budget, cfg.max_model_len - 1 - computed)
            if num_new <= 0:
                i += 1
                continue
            while not self._allocate(req, num_new):
                victim = self.running.pop()
                self._preempt(victim, now)
                preempted = True
                if victim is req:
                    break
            else:
                scheduled.append((req, num_new, req.num_preemptions))
                if req.lora is not None and self.loras is not None:
                    self._load(req)
                if req.num_computed < req.num_prompt or num_new > 1:
                    prefill_tokens += num_new
                budget -= num_new
                i += 1
        # The batch's adapters: a waiting request with another one waits while max_loras are in.
        loras = ({r.lora_id for r in running if r.lora_id is not None}
                 if self.loras is not None else None)
        skipped: list[SimRequest] = []
        # vLLM admits no waiting request in a step that had to preempt.
        while (
            not preempted and self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs
        ):
            req = self.waiting[0]
            if (loras is not None and req.lora_id is not None and req.lora_id not in loras
                    and len(loras) >= cfg.max_loras):
                skipped.append(self.waiting.popleft())
                continue
            admitted = self._admit(req, budget)
            if admitted is None:
                break
            num_new = admitted
            self.waiting.popleft()
            if loras is not None and req.lora_id is not None:
                loras.add(req.lora_id)
                self._load(req)
            self.running.append(req)
            if cfg.log_stats:
                req.events.append(EngineCoreEvent(EngineCoreEventType.SCHEDULED, now))
            scheduled.append((req, num_new, req.num_preemptions))
            prefill_tokens += num_new
            budget -= num_new
        if skipped:
            self.waiting.extendleft(reversed(skipped))
        duration = (
            cfg.step_time
            + cfg.prefill_time_per_token * prefill_tokens
            + cfg.decode_time_per_seq * len(scheduled)
        )
        return StepPlan(scheduled, duration)

    def _load(self, req: SimRequest) -> None:
        """The step's adapter, loaded from its path unless it is (then only touched); one that
        cannot load fails the engine, as it fails a vLLM worker's model execution."""
        assert self.loras is not None and req.lora is not None
        try:
            self.loras.add(req.lora)
        except LoRAError as exc:
            raise RuntimeError(worker_failure(str(exc))) from exc

    def _admit(self, req: SimRequest, budget: int) -> int | None:
        """Start ``req`` from its longest cached prefix; None if its blocks do not fit."""
        bs = self.block_size
        chain_hashes(req.tokens, bs, req.root, req.hashes)
        hit: list[int] = []
        if not req.skip_prefix:
            # At least one token must be computed to get logits: never hit the whole prompt.
            hit = self.pool.longest_hit(req.hashes, (req.num_tokens - 1) // bs)
        num_hit = len(hit) * bs
        num_new = min(req.num_tokens - num_hit, budget)
        needed = -(-(num_hit + num_new) // bs) - len(hit)
        if needed > self.pool.num_allocatable(hit):
            return None
        self.pool.touch(hit)
        req.blocks = hit + self.pool.allocate(needed)
        req.num_cached_blocks = len(hit)
        req.num_computed = num_hit
        if not req.skip_prefix and self.config.log_stats:
            self.pool.record_query(req.num_tokens, num_hit)
        if req.num_preemptions == 0:
            req.prefill_stats = {
                "num_prompt_tokens": req.num_prompt,
                "num_computed_tokens": req.num_prompt - num_hit,
                "num_cached_tokens": num_hit,
                "num_local_cached_tokens": num_hit,
                "num_external_cached_tokens": 0,
                "num_cache_creation_tokens": 0,
            }
        self._cache_full(req, num_hit + num_new)
        return num_new

    def _allocate(self, req: SimRequest, num_new: int) -> bool:
        needed = -(-(req.num_computed + num_new) // self.block_size) - len(req.blocks)
        if needed > self.pool.num_free:
            return False
        if needed > 0:
            req.blocks += self.pool.allocate(needed)
        self._cache_full(req, req.num_computed + num_new)
        return True

    def _cache_full(self, req: SimRequest, num_computed_after: int) -> None:
        """Announce blocks that are full of tokens whose KV this step computes."""
        bs = self.block_size
        num_full = min(num_computed_after, req.num_tokens) // bs
        start = req.num_cached_blocks
        if num_full <= start:
            return
        chain_hashes(req.tokens, bs, req.root, req.hashes)
        self.pool.cache_full_blocks(
            req.blocks[start:num_full],
            req.hashes[start:num_full],
            req.hashes[start - 1] if start else None,
            req.tokens[start * bs : num_full * bs],
            lora_id=req.lora_id,
            lora_name=req.lora_name,
            extra_keys=req.extra_keys(start, num_full),
        )
        req.num_cached_blocks = num_full

    def _preempt(self, req: SimRequest, now: float) -> None:
        self._free(req)
        req.num_computed = 0
        req.num_preemptions += 1
        if self.config.log_stats:
            req.events.append(EngineCoreEvent(EngineCoreEventType.PREEMPTED, now))
        self.waiting.appendleft(req)

    # ---- completing a step ----

    def finish(self, plan: StepPlan) -> dict[int, EngineCoreOutputs]:
        """Apply a planned step: sample, check stops, free finished requests, build outputs."""
        by_client: dict[int, list[EngineCoreOutput]] = {}
        done = False
        max_model_len = self.config.max_model_len
        no_eos_draw = self.config.eos_prob == 0.0
        for req, num_new, preemptions in plan.scheduled:
            if req.finished or req.num_preemptions != preemptions:
                continue  # aborted, or preempted by a cache reset, while the step ran
            req.num_computed += num_new
            if req.num_computed < req.num_tokens:
                continue  # a prefill chunk: vLLM emits no partial-prefill output
            pos = req.num_tokens - req.num_prompt
            k = pos - req.stream_start
            if no_eos_draw and not req.scripted and pos >= req.min_tokens and k < len(req.stream):
                token = req.stream[k]  # the common decode path: a pre-drawn id
            else:
                token = self._sample(req, pos)
            req.tokens.append(token)
            req.num_tokens += 1
            # vLLM's check_stop order: EOS, stop ids, then length. Before min_tokens the
            # sampler never yields a stop id (see _sample), as vLLM masks them.
            finish: int | None = None
            stop_reason: int | None = None
            if token == req.eos:
                finish = FinishReason.STOP
            elif token in req.stop_ids:
                finish, stop_reason = FinishReason.STOP, token
            elif req.num_tokens >= max_model_len or pos + 1 >= req.max_tokens:
                finish = FinishReason.LENGTH
            stats = req.prefill_stats
            if stats is not None:
                req.prefill_stats = None
                created = min(req.num_cached_blocks * self.block_size, req.num_prompt)
                stats["num_cache_creation_tokens"] = max(0, created - stats["num_cached_tokens"])
            out = EngineCoreOutput(
                request_id=req.request_id,
                new_token_ids=[token],
                new_logprobs=self._logprobs(req, pos, token) if req.logprobs is not None else None,
                # The prompt's logprobs come once, with the request's first token (vLLM).
                new_prompt_logprobs_tensors=(self._prompt_logprobs(req)
                                             if stats is not None and req.prompt_logprobs
                                             is not None else None),
                finish_reason=finish,
                stop_reason=stop_reason,
                events=req.take_events() if req.events else None,
                prefill_stats=stats,
            )
            by_client.setdefault(req.client_index, []).append(out)
            if finish is not None:
                req.finished = done = True
                del self.requests[req.request_id]
                self._free(req)
        if done:
            self.running = [r for r in self.running if not r.finished]
        now = time.monotonic()
        outputs = {c: EngineCoreOutputs(outputs=o, timestamp=now) for c, o in by_client.items()}
        if self.config.log_stats:
            # vLLM returns stats to one frontend, even in a step without request outputs.
            first = next(iter(outputs.values()), None)
            if first is None:
                first = outputs[0] = EngineCoreOutputs(timestamp=now)
            first.scheduler_stats = self.stats()
        return outputs

    def _sample(self, req: SimRequest, pos: int) -> int:
        table = self.config.tokens
        masked = req.min_stop_ids if pos < req.min_tokens else frozenset()
        if req.scripted and pos < len(req.scripted) and req.scripted[pos] not in masked:
            return req.scripted[pos]
        eos = req.eos
        p = self.config.eos_prob
        if eos is not None and p > 0.0 and pos >= req.min_tokens:
            if splitmix64(req.key ^ 0x5EED ^ pos) / _U64 < p:
                return eos
        if req.markov is not None:
            key, positional = req.markov
            token = markov_token(table, splitmix64(key ^ pos) if positional else key,
                                 req.tokens)
            salt = 0
            while token in masked and salt < 64:
                salt += 1
                token = next_token(table, key ^ salt, pos)
            return token
        k = pos - req.stream_start
        if not 0 <= k < len(req.stream):
            if req.echo:
                req.stream = echo_stream(req.echo, req.echo_loop, pos, _STREAM_CHUNK)
            else:
                req.stream = token_stream(table, req.key, pos, _STREAM_CHUNK)
            req.stream_start, k = pos, 0
        token = req.stream[k]
        if not masked:
            return token
        salt = 0
        while token in masked and salt < 64:
            salt += 1
            token = next_token(table, req.key ^ salt, pos)
        return token

    def _logprobs(self, req: SimRequest, pos: int, token: int) -> tuple[Any, ...]:
        k = req.logprobs
        assert k is not None
        if k < 0:
            k = self.config.tokens.vocab_size
        ids, lps = logprobs_row(self.config.tokens, req.key, pos, token, k)
        if req.logprob_ids:  # the asked ids after the sampled token, in their order
            ids[1:] = req.logprob_ids
        return (ids.reshape(1, -1), lps.reshape(1, -1), np.ones(1, dtype=np.int64), None)

    def _prompt_logprobs(self, req: SimRequest) -> tuple[Any, ...]:
        """vLLM's prompt LogprobsTensors: per prompt position after the first, its token then
        the top-k, and the token's rank (rows drawn as the sampled ones are)."""
        k = req.prompt_logprobs
        assert k is not None
        if k < 0:
            k = self.config.tokens.vocab_size
        prompt = req.tokens[:req.num_prompt]
        rows = [logprobs_row(self.config.tokens, req.key ^ 0x9E37, pos, token, k)
                for pos, token in enumerate(prompt[1:], start=1)]
        ids = np.stack([r[0] for r in rows]) if rows else np.zeros((0, k + 1), np.int32)
        lps = np.stack([r[1] for r in rows]) if rows else np.zeros((0, k + 1), np.float32)
        return (ids, lps, np.ones(len(rows), dtype=np.int64))

    def stats(self) -> dict[str, Any]:
        """vLLM ``SchedulerStats`` as the map msgspec makes of the dataclass."""
        return {
            "num_running_reqs": len(self.running),
            "num_waiting_reqs": len(self.waiting),
            "num_skipped_waiting_reqs": 0,
            "num_kv_fetch_reqs_by_stage": {},
            "step_counter": 0,
            "current_wave": 0,
            "kv_cache_usage": self.pool.usage,
            "iteration_details": None,
            "prefix_cache_stats": self.pool.take_stats(),
            "connector_prefix_cache_stats": None,
            "kv_cache_eviction_events": [],
            "spec_decoding_stats": None,
            "kv_connector_stats": None,
            "ec_connector_stats": None,
            "waiting_lora_adapters": {},
            "running_lora_adapters": {},
            "cudagraph_stats": None,
            "perf_stats": None,
        }

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """vLLM's utility: only succeeds when no block is in use, unless running requests are
        preempted first (they recompute from scratch)."""
        if reset_running_requests:
            now = time.monotonic()
            while self.running:
                self._preempt(self.running.pop(), now)
        return self.pool.reset()
