"""Start simulated engines for tests, benchmarks and demos: in-process threads or subprocesses.

The frontend (kvroute's EngineClient, or a test) binds the handshake ROUTER first; engines then
connect to it, exactly as ``vllm serve M --headless`` engines do::

    tokens = TokenTable.from_vocab_size(32000)          # or TokenTable.from_model_dir(dir)
    with sim_engines(["ipc:///tmp/x/hs0", "ipc:///tmp/x/hs1"], tokens=tokens, step_time=0.001):
        ...  # each engine has handshaken once its address was bound and answered

    proc = spawn_sim_engine("tcp://127.0.0.1:5555", ["--step-time", "0.002"])  # real process
    proc.kill()  # a crash (no ENGINE_CORE_DEAD); proc.terminate() is a clean stop

Threads share the GIL with the caller: use processes for throughput benchmarks.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sim.config import SimConfig
from sim.engine import SimEngine
from sim.tokens import TokenTable


class SimEngineThread:
    """A SimEngine running on a daemon thread of this process."""

    def __init__(self, config: SimConfig) -> None:
        self.engine = SimEngine(config)
        self.thread = threading.Thread(
            target=self._run, name=f"sim-engine-{config.data_parallel_rank}", daemon=True
        )

    def _run(self) -> None:
        try:
            self.engine.run()
        except Exception:  # recorded in engine.error; ENGINE_CORE_DEAD already sent
            pass

    def start(self) -> SimEngineThread:
        self.thread.start()
        return self

    def wait_ready(self, timeout: float) -> bool:
        """True once the handshake completed."""
        return self.engine.ready.wait(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        self.engine.stop()
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError("sim engine thread did not stop")


def start_sim_engine(
    handshake_address: str | None, tokens: TokenTable, **overrides: Any
) -> SimEngineThread:
    """One in-process engine; ``overrides`` are SimConfig fields (block_size, step_time, ...).
    ``handshake_address`` None: no ZMQ frontend (serve it through ``sim.http.face.HttpFace``)."""
    config = SimConfig(handshake_address=handshake_address, tokens=tokens, **overrides)
    return SimEngineThread(config).start()


@contextmanager
def sim_engines(
    handshake_addresses: Sequence[str], tokens: TokenTable, **overrides: Any
) -> Iterator[list[SimEngineThread]]:
    """N in-process engines, one per handshake address, stopped on exit."""
    engines = [start_sim_engine(a, tokens, **overrides) for a in handshake_addresses]
    try:
        yield engines
    finally:
        for e in engines:
            e.stop()


def spawn_sim_engine(
    handshake_address: str | None, extra_args: Sequence[str] = (), **popen: Any
) -> subprocess.Popen[bytes]:
    """``kvroute sim-engine`` as a child process (stop: terminate(); crash: kill()).
    ``handshake_address`` None: no ZMQ frontend (give ``--port`` in ``extra_args``)."""
    cmd = [sys.executable, "-m", "kvroute.cli", "sim-engine"]
    if handshake_address is not None:
        cmd += ["--handshake-address", handshake_address]
    cmd += extra_args
    return subprocess.Popen(cmd, **popen)
