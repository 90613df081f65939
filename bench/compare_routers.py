"""The routers bench/compare.py puts in front of the fleet, one at a time: how each is started.

    kvroute-http     kvroute cache_aware, engines over HTTP (vLLM's token-in /inference/v1/generate;
                     prefix index from the engines' KV events, found at /kv_event_sources)
    kvroute-zmq      kvroute cache_aware, the same engines over vLLM's headless ZMQ protocol
    kvroute-rr       kvroute round_robin over HTTP (the floor: no cache awareness)
    sglang           SGLang Model Gateway cache_aware (character tree from routing history)
    vllm-cache       vllm-router cache_aware (tree keyed by the token ids that every worker's
                     /v1/chat/completions/render returns for each request)
    vllm-kv          vllm-router kv_aware (radix index from the engines' KV events, static sources)
    oracle           bench/compare_oracle.py: kvroute's cost over every engine's true cache

Every router binds loopback only, logs warnings and worse only (a router logging each request
pays for it), and is ready when its /health (kvroute: /ready) answers 200.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from compare_anchors import Anchors, ensure_anchors
from compare_fleet import KVROUTE, ROOT, Fleet, free_ports

_HEALTHY = re.compile(r'^kvroute_engine_healthy\{[^}]*\} 1(?:\.0)?$', re.M)
ROUTERS = ("kvroute-http", "kvroute-zmq", "kvroute-rr", "sglang", "vllm-cache", "vllm-kv",
           "oracle")
KVROUTE_ROUTERS = ("kvroute-http", "kvroute-zmq", "kvroute-rr")
ANCHOR_ROUTERS = ("sglang", "vllm-cache", "vllm-kv")


def router_names(text: str) -> list[str]:
    """A comma-separated list of routers, each one of ROUTERS (else SystemExit naming them)."""
    names = [r for r in text.split(",") if r]
    for r in names:
        if r not in ROUTERS:
            raise SystemExit(f"unknown router {r!r}; choose from {', '.join(ROUTERS)}")
    return names


def anchors_for(names: Iterable[str]) -> Anchors | None:
    """The anchors' installs (bench/compare_anchors.py) if any of ``names`` is an anchor."""
    return ensure_anchors() if any(r in ANCHOR_ROUTERS for r in names) else None


@dataclass(frozen=True)
class Launch:
    name: str
    cmd: list[str]
    port: int
    ready_path: str
    engines: int = 0  # kvroute: wait until its /metrics shows this many engines healthy


def launch(name: str, fleet: Fleet, anchors: Anchors | None) -> Launch:
    port, metrics_port = free_ports(2)
    urls = [e.url for e in fleet.engines]
    common = ["--host", "127.0.0.1", "--port", str(port)]
    if name in KVROUTE_ROUTERS:
        cmd = [*KVROUTE, "router", *common, "--served-model-name", fleet.model,
               "--log-level", "WARNING", "--enable-prompt-tokens-details"]
        if name == "kvroute-zmq":
            cmd += [a for e in fleet.engines
                    for a in ("--engine", e.zmq_flag(fleet.timing.block_size))]
        else:
            cmd += [a for e in fleet.engines for a in ("--engine", f"{e.name}={e.url}")]
        cmd += ["--policy", "round_robin" if name == "kvroute-rr" else "cache_aware"]
        return Launch(name, cmd, port, "/ready", len(fleet.engines))
    if name == "oracle":
        cmd = [sys.executable, str(ROOT / "bench" / "compare_oracle.py"), "--port", str(port),
               "--model", fleet.model, *urls]
        return Launch(name, cmd, port, "/health")
    if anchors is None:
        raise ValueError(f"{name} needs the anchor routers (bench/compare_anchors.py)")
    if name == "sglang":
        cmd = [str(anchors.sglang_router), "launch", *common, "--worker-urls", *urls,
               "--policy", "cache_aware", "--log-level", "warn",
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
               "--worker-startup-check-interval", "1"]
        return Launch(name, cmd, port, "/health")
    cmd = [str(anchors.vllm_router), *common, "--worker-urls", *urls,
           "--log-level", "warning", "--prometheus-host", "127.0.0.1",
           "--prometheus-port", str(metrics_port), "--worker-startup-check-interval", "1"]
    if name == "vllm-cache":
        cmd += ["--policy", "cache_aware"]
    elif name == "vllm-kv":
        cmd += ["--policy", "kv_aware", "--kv-event-block-size", str(fleet.timing.block_size),
                "--kv-event-model", fleet.model]
        for e in fleet.engines:
            cmd += ["--kv-event-source", f"{e.url}={e.kv}",
                    "--kv-event-replay-source", f"{e.url}={e.replay}"]
    else:
        raise ValueError(f"unknown router {name!r}; choose from {', '.join(ROUTERS)}")
    return Launch(name, cmd, port, "/health")


class Running:
    """A started router process: wait for it, then stop it."""

    def __init__(self, spec: Launch, log: Path) -> None:
        self.spec = spec
        self.log = log
        self._log = open(log, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(spec.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     cwd=ROOT)

    def wait_ready(self, timeout: float = 180.0) -> float:
        """Seconds until ready; raises with the log's tail if it dies or never answers."""
        t0 = time.monotonic()
        url = f"http://127.0.0.1:{self.spec.port}{self.spec.ready_path}"
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.spec.name} exited {self.proc.returncode}: "
                                   f"{self.log.read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200 and self._engines_ready():
                        return time.monotonic() - t0
            except OSError:
                pass
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{self.spec.name} not ready after {timeout:.0f} s")
            time.sleep(0.2)

    def _engines_ready(self) -> bool:
        if not self.spec.engines:
            return True
        url = f"http://127.0.0.1:{self.spec.port}/metrics"
        with urllib.request.urlopen(url, timeout=2) as r:
            text = r.read().decode()
        return len(_HEALTHY.findall(text)) >= self.spec.engines

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
