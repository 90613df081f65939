"""One real `vllm serve` (OpenAI server, tiny random-weight Qwen3) shared by the whole session.

It is the parity oracle (the same requests sent to it and to kvroute must get the same answers)
and an ordinary pod that kvroute can use as an HTTP engine: `--enable-scale-out` turns on vLLM's
token-in API (`/inference/v1/generate`, `/inference/v1/abort_requests`), and KV events go to ipc
endpoints that `/kv_event_sources` reports. Started once per session (~60-150 s on two cores);
every test that needs it asks for the `vllm_serve` fixture.

The server binds port 0; its port is the one of the process's listening sockets that answers
`/health`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from tests.engines import MAX_MODEL_LEN, TINY_MODEL, VLLM_START_TIMEOUT, VLLM_VENV

# The model name both the oracle and a kvroute router in front of the same model serve.
SERVED_NAME = "tiny-qwen3"

# Flags every session's `vllm serve` runs with. A test stage that needs another vLLM behaviour
# switched on adds its flag here (one process serves every stage), never a second server.
SERVE_FLAGS: tuple[str, ...] = (
    "--served-model-name", SERVED_NAME,
    "--max-model-len", str(MAX_MODEL_LEN),
    "--dtype", "bfloat16",
    "--enforce-eager",  # skips the torch.compile warm-up; the API is the same
    "--enable-scale-out",  # the token-in API of an ordinary pod
)


@dataclass
class VllmServe:
    """The running server: where it listens, where its KV events are published, its log."""

    proc: subprocess.Popen[bytes]
    base_url: str
    kv_endpoint: str
    kv_replay_endpoint: str
    kv_topic: str
    log_path: Path

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=60)


def _listening_ports(pid: int) -> list[int]:
    """The loopback TCP ports the API server process listens on (its HTTP port among them; the
    engine's own sockets live in child processes)."""
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        return []
    return sorted({int(c.laddr.port) for c in conns
                   if c.status == psutil.CONN_LISTEN and c.laddr.ip == "127.0.0.1"})


def _wait_healthy(server: VllmServe, deadline: float) -> None:
    """Probes the server's listening ports for `/health` until one answers 200 or the deadline
    passes (a start takes minutes; each probe is bounded by a poll timeout, not a sleep)."""
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited ({server.proc.returncode}):\n"
                                   f"{server.log_tail()}")
            for port in _listening_ports(server.proc.pid):
                try:
                    if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                        server.base_url = f"http://127.0.0.1:{port}"
                        return
                except httpx.HTTPError:
                    pass
            try:
                server.proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
    raise RuntimeError(f"vllm serve not healthy in time:\n{server.log_tail()}")


def start_vllm_serve(workdir: Path, extra: tuple[str, ...] = ()) -> VllmServe:
    if not (VLLM_VENV / ".ready").exists() or not (TINY_MODEL / ".ready").exists():
        pytest.fail(f"the real-vLLM stage needs {VLLM_VENV} and {TINY_MODEL}: run "
                    "`bash scripts/vllm_env.sh` first (or deselect with -m 'not vllm')")
    workdir.mkdir(parents=True, exist_ok=True)
    kv = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"ipc://{workdir}/serve-kv",
        "replay_endpoint": f"ipc://{workdir}/serve-kv-replay",
        "topic": "kv",
    }
    argv = [str(VLLM_VENV / "bin" / "vllm"), "serve", str(TINY_MODEL), "--host", "127.0.0.1",
            "--port", "0", *SERVE_FLAGS, "--kv-events-config", json.dumps(kv), *extra]
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="1",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    log_path = workdir / "vllm-serve.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    server = VllmServe(proc, "", kv["endpoint"], kv["replay_endpoint"], kv["topic"], log_path)
    try:
        _wait_healthy(server, time.monotonic() + VLLM_START_TIMEOUT)
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="session")
def vllm_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServe]:
    """The session's `vllm serve`: oracle for API parity and an HTTP engine for the router."""
    t0 = time.monotonic()
    server = start_vllm_serve(tmp_path_factory.mktemp("vllm-serve"))
    print(f"\nvllm serve ready in {time.monotonic() - t0:.0f}s at {server.base_url}",
          file=sys.stderr)
    yield server
    server.stop()
