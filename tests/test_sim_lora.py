"""The sim engine's LoRA, as a vLLM engine started with --enable-lora behaves on the wire.

The real engine is the referee in tests/test_lora_vllm.py (the same utility answers and KV event
shapes side by side); here each behaviour on its own: the utilities and their failure messages,
the LRU of loaded adapters, the lazy load a request triggers, max_loras per batch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import zmq

from tests.test_sim_engine import TIMEOUT_MS, Harness, events_of
from wire import engine as wire


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    c: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield c
    c.destroy(linger=0)


@pytest.fixture
def sim(ctx: zmq.Context[zmq.Socket[bytes]], tmp_path: Path) -> Iterator[Harness]:
    (tmp_path / "engine").mkdir()
    h = Harness(ctx, tmp_path / "engine")
    yield h
    h.stop()


def adapter(root: Path, name: str, rank: int = 8, **extra: object) -> str:
    """A PEFT adapter directory (only its config: the sim reads no weights)."""
    path = root / name
    path.mkdir()
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 16,
              "target_modules": ["q_proj", "v_proj"], "bias": "none", **extra}
    (path / "adapter_config.json").write_text(json.dumps(config))
    return str(path)


def _worker_error(message: str) -> str:
    return (f"Worker failed with error '{message}', please check the stack trace above for the "
            "root cause")


def test_ready_response_announces_lora(sim: Harness) -> None:
    sim.start(enable_lora=True, max_loras=3)
    ready = msgspec.convert(sim.fe.ready, wire.EngineReadyResponse)
    assert (ready.supports_lora, ready.max_loras) == (True, 3)


def test_utilities_without_enable_lora_fail_as_vllm(sim: Harness, tmp_path: Path) -> None:
    fe = sim.start()
    assert msgspec.convert(fe.ready, wire.EngineReadyResponse).supports_lora is False
    lora = wire.LoRARequest("a", 1, adapter(tmp_path, "a"))
    out = fe.utility(1, "add_lora", lora)
    assert out.failure_message == "Call to add_lora method failed: " + _worker_error(
        "LoRA is not enabled. Use --enable-lora to enable LoRA.")
    assert fe.utility(2, "list_loras").failure_message is not None


def test_add_list_remove_pin(sim: Harness, tmp_path: Path) -> None:
    fe = sim.start(enable_lora=True, max_loras=2)
    a = wire.LoRARequest("a", 1, adapter(tmp_path, "a"))
    assert fe.utility(1, "add_lora", a).result == [None, True]
    assert fe.utility(2, "add_lora", a).result == [None, True]  # already loaded: touched
    assert fe.utility(3, "list_loras").result == [None, [1]]
    assert fe.utility(4, "pin_lora", 1).result == [None, True]
    assert fe.utility(5, "remove_lora", 1).result == [None, True]
    assert fe.utility(6, "remove_lora", 1).result == [None, False]
    assert fe.utility(7, "list_loras").result == [None, []]
    pin = fe.utility(8, "pin_lora", 1)
    assert pin.failure_message == "Call to pin_lora method failed: " + _worker_error(
        "Pinning failed. LoRA 1 is not registered.")
    bad_id = fe.utility(9, "remove_lora", 0)
    assert bad_id.failure_message == "Call to remove_lora method failed: lora_id must be " \
        "greater than 0."


@pytest.mark.parametrize(("make", "message"), [
    (lambda root: str(root / "missing"), "Loading lora x failed: No adapter found for {path}"),
    (lambda root: adapter(root, "big", rank=64), "LoRA rank 64 is greater than max_lora_rank 16."),
    (lambda root: adapter(root, "bias", bias="all"), "Adapter bias is not supported."),
])
def test_add_lora_checks_the_adapter_as_vllm(sim: Harness, tmp_path: Path, make: object,
                                             message: str) -> None:
    fe = sim.start(enable_lora=True)
    path = make(tmp_path)  # type: ignore[operator]
    out = fe.utility(1, "add_lora", wire.LoRARequest("x", 1, path))
    assert out.result is None
    assert out.failure_message == "Call to add_lora method failed: " + _worker_error(
        message.format(path=path))
    assert fe.utility(2, "list_loras").result == [None, []]


def test_loaded_adapters_are_an_lru_of_max_cpu_loras(sim: Harness, tmp_path: Path) -> None:
    fe = sim.start(enable_lora=True, max_loras=1, max_cpu_loras=2)
    loras = [wire.LoRARequest(n, i, adapter(tmp_path, n)) for i, n in enumerate("abc", 1)]
    fe.utility(1, "add_lora", loras[0])
    fe.utility(2, "add_lora", loras[1])
    fe.utility(3, "add_lora", loras[0])  # touched: b is now the oldest
    fe.utility(4, "add_lora", loras[2])
    assert fe.utility(5, "list_loras").result == [None, [1, 3]]
    fe.utility(6, "pin_lora", 1)
    fe.utility(7, "add_lora", loras[1])  # a is pinned: c goes
    assert fe.utility(8, "list_loras").result == [None, [1, 2]]


def test_a_request_loads_its_adapter_and_tags_its_blocks(sim: Harness, tmp_path: Path) -> None:
    fe = sim.start(enable_lora=True)
    lora = wire.LoRARequest("sql", 7, adapter(tmp_path, "sql"))
    fe.add("r", list(range(1, 10)), lora=lora, max_tokens=2)
    got, _ = fe.run("r")
    assert len(fe.tokens(got["r"])) == 2
    assert fe.utility(1, "list_loras").result == [None, [7]]  # loaded from lora_path on use
    stored = [e for e in events_of(sim.replay()) if isinstance(e, wire.BlockStored)]
    assert stored and all(e.lora_id == 7 and e.lora_name == "sql" for e in stored)
    assert all(keys == ["sql"] for e in stored for keys in e.extra_keys or [])


def test_an_adapter_that_cannot_load_fails_the_engine(sim: Harness, tmp_path: Path) -> None:
    fe = sim.start(enable_lora=True)
    fe.add("r", [1, 2, 3], lora=wire.LoRARequest("gone", 1, str(tmp_path / "gone")),
           max_tokens=1)
    assert fe.out.poll(TIMEOUT_MS)
    assert fe.out.recv_multipart() == [wire.ENGINE_CORE_DEAD]
    assert sim.engine is not None
    sim.engine.thread.join(10)
    assert "No adapter found" in str(sim.engine.engine.error)


def test_max_loras_bounds_the_adapters_in_a_batch(sim: Harness, tmp_path: Path) -> None:
    fe = sim.start(enable_lora=True, max_loras=1, max_cpu_loras=2, step_time=0.005)
    a = wire.LoRARequest("a", 1, adapter(tmp_path, "a"))
    b = wire.LoRARequest("b", 2, adapter(tmp_path, "b"))
    fe.add("a1", [1, 2, 3], lora=a, max_tokens=4, ignore_eos=True)
    fe.add("b1", [4, 5, 6], lora=b, max_tokens=4, ignore_eos=True)
    fe.add("a2", [7, 8, 9], lora=a, max_tokens=4, ignore_eos=True)
    order: list[tuple[str, bool]] = []
    pending = {"a1", "b1", "a2"}
    while pending:
        for o in fe.recv().outputs:
            order.append((o.request_id, o.finished))
            if o.finished:
                pending.discard(o.request_id)
    # a2 shares a1's adapter and runs beside it; b1 waits for both (one adapter per batch).
    first_b = order.index(("b1", False))
    assert ("a1", True) in order[:first_b] and ("a2", True) in order[:first_b]
