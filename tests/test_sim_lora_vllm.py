"""The sim engine against a REAL vLLM engine on LoRA: the same utility answers and failure
messages, the same LoRA identity on the KV events of an adapter's blocks.

Both are the session's engines (tests/engines.py: --enable-lora --max-lora-rank 8 --max-loras 2),
driven as a re-adopting frontend. Adapter ids here start at 101, clear of the router tests' ids.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from tests.engines import TINY_LORA, VLLM_VENV, EngineProc
from tests.test_sim_engine import Frontend, events_of, replay
from wire import engine as wire

pytestmark = [pytest.mark.vllm]

IDS = (101, 102, 103, 104)


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    c: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield c
    c.destroy(linger=0)


def _adopt(ctx: zmq.Context[zmq.Socket[bytes]], engine: EngineProc) -> Frontend:
    """A frontend on the engine's input/output addresses (it handshook already)."""
    fe = Frontend.__new__(Frontend)
    fe.ctx, fe.in_addr, fe.out_addr = ctx, engine.spec.input_address, engine.spec.output_address
    fe.enc = msgspec.msgpack.Encoder(enc_hook=wire.enc_hook)
    fe.dec = msgspec.msgpack.Decoder(wire.EngineCoreOutputs, ext_hook=wire.ext_hook)
    fe.aux, fe.identity = {}, b"\x00\x00"
    fe.hs = ctx.socket(zmq.ROUTER)  # unused
    fe.bind_io()
    monitor = fe.inp.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    assert monitor.poll(60_000), "the engine did not reconnect"
    fe.inp.disable_monitor()
    monitor.close(linger=0)
    return fe


def _scenario(ctx: zmq.Context[zmq.Socket[bytes]], engine: EngineProc,
              big_rank: str) -> dict[str, Any]:
    fe = _adopt(ctx, engine)
    calls = iter(range(1, 1000))

    def call(method: str, *args: Any) -> tuple[Any, str | None]:
        out = fe.utility(next(calls), method, *args)
        return out.result, out.failure_message

    def ours() -> list[int]:
        return [i for i in call("list_loras")[0][1] if i in IDS]

    try:
        for lid in IDS:  # a clean slate, whatever an earlier test left loaded
            call("remove_lora", lid)
        seen = len(replay(ctx, engine.kv.replay_endpoint))
        tiny = wire.LoRARequest("tiny-s", 101, str(TINY_LORA))
        result: dict[str, Any] = {
            "add": call("add_lora", tiny),
            "add_again": call("add_lora", tiny),
            "missing": call("add_lora", wire.LoRARequest("gone", 102, "/no/such/kvroute-lora")),
            "big_rank": call("add_lora", wire.LoRARequest("big", 102, big_rank)),
            "listed": ours(),
        }
        prompt = list(range(1000, 1300))
        fe.add("lora-a", prompt, lora=tiny, temperature=0.0, max_tokens=2)
        got, _ = fe.run("lora-a")
        result["outputs"] = [(len(o.new_token_ids), o.finish_reason) for o in got["lora-a"]]
        stored = [e for e in events_of(replay(ctx, engine.kv.replay_endpoint, seen))
                  if isinstance(e, wire.BlockStored) and e.lora_name is not None]
        result["events"] = [(e.lora_id, e.lora_name, len(e.block_hashes),
                             [list(k) if k is not None else None for k in e.extra_keys or []])
                            for e in stored]
        # An id never added: the engine loads it from lora_path for the request.
        lazy = wire.LoRARequest("tiny-lazy", 103, str(TINY_LORA))
        fe.add("lora-b", list(range(2000, 2010)), lora=lazy, temperature=0.0, max_tokens=1)
        fe.run("lora-b")
        result["listed_after_lazy"] = ours()
        result["remove"] = call("remove_lora", 101)
        result["remove_again"] = call("remove_lora", 101)
        result["remove_zero"] = call("remove_lora", 0)
        result["pin_unknown"] = call("pin_lora", 104)
        result["listed_at_end"] = ours()
        call("remove_lora", 103)
        return result
    finally:
        fe.close()


def test_sim_matches_real_vllm_on_lora(ctx: zmq.Context[zmq.Socket[bytes]], sim_engine: Any,
                                       vllm_engine: Any, tmp_path: Path) -> None:
    if not (TINY_LORA / ".ready").exists():
        pytest.fail(f"no {TINY_LORA}: run `bash scripts/vllm_env.sh` first")
    big = tmp_path / "rank16"
    big.mkdir()
    config = json.loads((TINY_LORA / "adapter_config.json").read_text())
    (big / "adapter_config.json").write_text(json.dumps({**config, "r": 16}))
    real = _scenario(ctx, vllm_engine, str(big))
    sim = _scenario(ctx, sim_engine, str(big))
    assert real["add"] == ([None, True], None) and real["listed"] == [101]
    assert real["events"] and real["listed_after_lazy"] == [101, 103]
    assert {k: (sim[k], v) for k, v in real.items() if sim[k] != v} == {}


def _vllm_fields(source: Path, cls: str) -> list[list[Any]]:
    """A msgspec Struct's fields in vLLM's source, in order: [name, default] (None: required)."""
    tree = ast.parse(source.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    out: list[list[Any]] = []
    for item in node.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        value = item.value
        if isinstance(value, ast.Call):  # msgspec.field(default=...)
            value = next(k.value for k in value.keywords if k.arg == "default")
        out.append([item.target.id, None if value is None else ast.literal_eval(value)])
    return out


def test_wire_lora_request_mirrors_vllms() -> None:
    """wire.engine.LoRARequest field by field (names, order, defaults) against vLLM's class."""
    source = next(VLLM_VENV.glob("lib/python3*/site-packages/vllm/lora/request.py"), None)
    if source is None:
        pytest.fail(f"no vLLM under {VLLM_VENV}: run `bash scripts/vllm_env.sh` first")
    ours = [[f.name, None if f.required else f.default]
            for f in msgspec.structs.fields(wire.LoRARequest)]
    assert ours == _vllm_fields(source, "LoRARequest")
    assert wire.LoRARequest.__struct_config__.array_like
