"""Test helper: simulated `vllm serve` pods, each an engine behind its HTTP face on its own
loopback address (127.0.0.2, 127.0.0.3, ...: every 127/8 address is local on Linux)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from render.models import EMBEDDED_MODEL, EMBEDDED_SERVED_NAME
from render.renderer import Renderer
from sim.config import DEFAULT_MAX_MODEL_LEN, HttpFaceConfig, KVEventsConfig
from sim.http.face import HttpFace
from sim.launch import SimEngineThread, start_sim_engine
from sim.tokens import TokenTable


@dataclass
class Pod:
    name: str
    host: str
    thread: SimEngineThread
    face: HttpFace

    @property
    def port(self) -> int:
        return self.face.port

    @property
    def url(self) -> str:
        return self.face.url


@dataclass
class Pods:
    """Starts pods on demand; ``close`` stops them all."""

    dir: Path  # KV-event ipc sockets live here
    sim: dict[str, Any] = field(default_factory=dict)  # SimConfig overrides
    pods: dict[str, Pod] = field(default_factory=dict)
    _tokens: TokenTable | None = None
    _renderer: Renderer | None = None
    _started: int = 0  # pods started so far (each one's sockets get the next number)

    def start(self, name: str, host: str) -> Pod:
        if self._tokens is None:
            self._tokens = TokenTable.from_model_dir(EMBEDDED_MODEL)
            self._renderer = Renderer.load(EMBEDDED_MODEL, served_model_name=EMBEDDED_SERVED_NAME,
                                           max_model_len=DEFAULT_MAX_MODEL_LEN)
        # Sockets named by the pod's number, not its name: an ipc path holds 107 bytes at most.
        self._started += 1
        sock = f"ipc://{self.dir}/p{self._started}"
        kv = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                            endpoint=f"{sock}.kv", replay_endpoint=f"{sock}.replay")
        face = HttpFaceConfig(EMBEDDED_MODEL, EMBEDDED_SERVED_NAME, host=host, port=0,
                              enable_prompt_tokens_details=True)
        thread = start_sim_engine(None, self._tokens, kv_events=kv, http=face,
                                  **{"max_model_len": DEFAULT_MAX_MODEL_LEN, **self.sim})
        http = HttpFace(thread.engine, self._renderer).start()
        if not http.wait_ready() or http.error is not None:
            thread.stop()
            raise RuntimeError(f"pod {name}'s HTTP face did not start: {http.error!r}")
        pod = self.pods[name] = Pod(name, host, thread, http)
        return pod

    def close(self) -> None:
        for pod in self.pods.values():
            pod.thread.stop()
