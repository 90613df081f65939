"""bench/compare.py's simulated fleet: N `kvroute sim-engine` processes serving both faces.

Each engine serves vLLM's headless ZMQ protocol (it dials the handshake address a kvroute router
binds) and its HTTP face (`vllm serve`'s endpoints: what the HTTP routers and kvroute's HTTP
transport use, and /metrics for every run), with a real prefix cache, KV events on ZMQ (with
replay) and a step time that grows with the batch and the uncached prompt tokens computed.

The fleet is started once and shared by every run: before a run its prefix caches are emptied
(``POST /reset_prefix_cache``, vLLM's route; engines announce ``AllBlocksCleared``) and its
counters read, after the run read again. An engine waits for a ZMQ frontend before it serves
anything, so the fleet links a kvroute router over ZMQ once at start; engines never give up on a
frontend that left (``--frontend-gone-timeout 0``), and each later ZMQ router re-adopts them.
Without a ZMQ router in the comparison the engines serve their HTTP face only.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from compare_metrics import EngineSnapshot, cpu_seconds, scrape

ROOT = Path(__file__).resolve().parent.parent
KVROUTE = [sys.executable, "-m", "kvroute.cli"]


# Every port free_ports handed out in this process: a port is free when chosen, but a sim
# binds its KV ports only once it is ready, so the kernel could hand the same port to the next
# process started meanwhile (it did: a sim's KV port and the fleet's ZMQ router's HTTP port).
_HANDED_OUT: set[int] = set()


def free_ports(n: int) -> list[int]:
    """``n`` loopback ports free now and not handed out before by this process."""
    socks = []
    ports: list[int] = []
    try:
        while len(ports) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)  # held until all are chosen: no port twice in one call
            port = int(s.getsockname()[1])
            if port not in _HANDED_OUT:
                ports.append(port)
        _HANDED_OUT.update(ports)
        return ports
    finally:
        for s in socks:
            s.close()


@dataclass(frozen=True)
class SimTiming:
    """The sims' scheduler and cost model (kvroute sim-engine's flags)."""

    num_gpu_blocks: int = 2048
    block_size: int = 16
    step_time: float = 0.004
    prefill_time_per_token: float = 1e-4
    decode_time_per_seq: float = 2e-4
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 8192

    def flags(self) -> list[str]:
        return ["--num-gpu-blocks", str(self.num_gpu_blocks), "--block-size", str(self.block_size),
                "--step-time", str(self.step_time),
                "--prefill-time-per-token", str(self.prefill_time_per_token),
                "--decode-time-per-seq", str(self.decode_time_per_seq),
                "--max-num-seqs", str(self.max_num_seqs),
                "--max-num-batched-tokens", str(self.max_num_batched_tokens)]


@dataclass
class Engine:
    name: str
    http_port: int
    handshake_port: int
    kv_port: int
    replay_port: int
    input_port: int
    output_port: int
    proc: subprocess.Popen[bytes] | None = None
    ps: psutil.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def kv(self) -> str:
        return f"tcp://127.0.0.1:{self.kv_port}"

    @property
    def replay(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    @property
    def handshake(self) -> str:
        return f"tcp://127.0.0.1:{self.handshake_port}"

    def zmq_flag(self, block_size: int) -> str:
        """kvroute's --engine for this engine over ZMQ. Its input/output addresses are fixed,
        so a later router binding them re-adopts the running engine (which handshakes once);
        the KV endpoints are the engine's (it binds them) and the block size is given, as a
        re-adopted engine sends no ready map."""
        return (f"{self.name}={self.handshake},input=tcp://127.0.0.1:{self.input_port},"
                f"output=tcp://127.0.0.1:{self.output_port},kv=tcp://*:{self.kv_port},"
                f"replay=tcp://*:{self.replay_port},block_size={block_size}")


@dataclass
class Fleet:
    model: str
    timing: SimTiming
    engines: list[Engine] = field(default_factory=list)
    logs: Path | None = None
    zmq: bool = True  # serve the ZMQ face too (else HTTP only: ready without a ZMQ frontend)
    # kvroute sim-engine --render-work: "vllm" bills a text request's render at vLLM's CPU,
    # "vllm-time" makes it wait vLLM's render time, render_time (--render-time BASE_MS,US)
    render_work: str = "kvroute"
    render_time: str | None = None

    @classmethod
    def plan(cls, n: int, model: str, timing: SimTiming, logs: Path, zmq: bool = True,
             render_work: str = "kvroute", render_time: str | None = None) -> Fleet:
        ports = free_ports(6 * n)
        engines = [Engine(f"e{i}", *ports[6 * i:6 * i + 6]) for i in range(n)]
        return cls(model, timing, engines, logs, zmq, render_work, render_time)

    def start(self, timeout: float = 300.0) -> None:
        assert self.logs is not None
        self.logs.mkdir(parents=True, exist_ok=True)
        for e in self.engines:
            kv = {"enable_kv_cache_events": True, "publisher": "zmq",
                  "endpoint": f"tcp://*:{e.kv_port}", "replay_endpoint": f"tcp://*:{e.replay_port}"}
            zmq = ["--handshake-address", e.handshake] if self.zmq else []
            cmd = [*KVROUTE, "sim-engine", *zmq,
                   "--port", str(e.http_port), "--served-model-name", self.model,
                   "--kv-events-config", json.dumps(kv), "--frontend-gone-timeout", "0",
                   "--enable-prompt-tokens-details", "--render-work", self.render_work,
                   *(["--render-time", self.render_time] if self.render_time else []),
                   "--handshake-timeout", str(timeout), *self.timing.flags()]
            log = open(self.logs / f"{e.name}.log", "wb")  # noqa: SIM115 (the child keeps it)
            e.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
            e.ps = psutil.Process(e.proc.pid)
        deadline = time.monotonic() + timeout
        for e in self.engines:
            self._wait_face(e, deadline)

    def _wait_face(self, e: Engine, deadline: float) -> None:
        assert e.proc is not None and self.logs is not None
        log = self.logs / f"{e.name}.log"
        while b"HTTP face on" not in log.read_bytes():
            if e.proc.poll() is not None:
                raise RuntimeError(f"sim {e.name} exited: {log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"sim {e.name} did not start")
            time.sleep(0.2)

    def wait_healthy(self, timeout: float = 120.0) -> None:
        """Every engine serves requests (its face answers /health 200: handshaken)."""
        deadline = time.monotonic() + timeout
        for e in self.engines:
            while True:
                try:
                    with urllib.request.urlopen(e.url + "/health", timeout=5) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"sim {e.name} is not healthy")
                time.sleep(0.2)

    def reset(self, timeout: float = 60.0) -> None:
        """Empty every engine's prefix cache (retried while a straggler still holds blocks)."""
        deadline = time.monotonic() + timeout
        for e in self.engines:
            while True:
                req = urllib.request.Request(e.url + "/reset_prefix_cache", method="POST",
                                             data=b"")
                with urllib.request.urlopen(req, timeout=10) as r:
                    if json.loads(r.read()).get("success"):
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"sim {e.name} kept blocks in use")
                time.sleep(0.2)

    def warm(self, bodies: list[bytes], timeout: float = 60.0) -> None:
        """Send each chat body to each engine's own HTTP face, then empty the caches. A fresh
        fleet's first long prefills are slower (measured from outside: tenants' first second
        took ~25 ms more per request in the first run on a fresh fleet than in the next run, a
        new router process on the same engines; what inside the engine costs it was not looked
        into), and without this the first router measured pays for them."""
        for e in self.engines:
            for body in bodies:
                req = urllib.request.Request(e.url + "/v1/chat/completions", data=body,
                                             headers={"content-type": "application/json"})
                with urllib.request.urlopen(req, timeout=timeout) as r:
                    r.read()
        self.reset()

    def snapshot(self) -> list[EngineSnapshot]:
        return [scrape(e.url) for e in self.engines]

    def renders(self) -> tuple[int, float]:
        """Text requests the pods have rendered at vLLM's cost (CPU or time) so far, and the
        render time they waited (--render-work vllm-time), from the pods' own count; (0, 0.0)
        when render_work is "kvroute"."""
        if self.render_work == "kvroute":
            return 0, 0.0
        total, seconds = 0, 0.0
        for e in self.engines:
            with urllib.request.urlopen(e.url + "/sim/render_work", timeout=10) as r:
                work = json.loads(r.read())
            total += int(work["vllm_renders"])
            seconds += float(work["render_seconds"])
        return total, seconds

    def cpu(self) -> list[float]:
        return [cpu_seconds(e.ps) if e.ps is not None else 0.0 for e in self.engines]

    def check_alive(self) -> None:
        for e in self.engines:
            if e.proc is None or e.proc.poll() is not None:
                raise RuntimeError(f"sim {e.name} is not running")

    def stop(self) -> None:
        for e in self.engines:
            if e.proc is not None and e.proc.poll() is None:
                e.proc.terminate()
        for e in self.engines:
            if e.proc is not None:
                try:
                    e.proc.wait(10)
                except subprocess.TimeoutExpired:
                    e.proc.kill()
                    e.proc.wait()
