"""A router killed under load and started again with the same config re-adopts its running
engines, with their KV feeds, without a handshake: prefix hits resume, no engine restarts.

No address is given by hand: the engines' input/output addresses are derived from their
handshake addresses, and their KV endpoints (from the handshake's ready map) are what the
first router kept in its state directory.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from router.config import EngineSpec, add_arguments, from_args
from router.routing.engine_memory import EngineMemory
from tests.procs import Proc, started
from tests.test_signals import EXIT_TIMEOUT
from tests.waits import eventually
from wire.engine import EngineReadyResponse

MODEL = "Qwen/Qwen3-0.6B"
NAMES = ("a", "b")
# Eight 16-token blocks and more: a prefix the engine caches and announces.
PROMPT = " ".join(f"word{i}" for i in range(200))


def _sim(tmp: Path, name: str) -> list[str]:
    kv = {"enable_kv_cache_events": True, "publisher": "zmq",
          "endpoint": f"ipc://{tmp}/{name}.kv", "replay_endpoint": f"ipc://{tmp}/{name}.replay"}
    return ["sim-engine", "--handshake-address", f"ipc://{tmp}/{name}.hs", "--step-time", "0.02",
            "--kv-events-config", json.dumps(kv)]


@contextmanager
def _router(tmp: Path) -> Iterator[tuple[Proc, str]]:
    args = ["router", "--port", "0", "--plain-logs", "--state-dir", str(tmp / "state"),
            "--max-model-len", "4096", "--enable-prompt-tokens-details"]
    for name in NAMES:
        args += ["--engine", f"{name}=ipc://{tmp}/{name}.hs"]
    with started(args) as router:
        url = router.wait_for(r"kvroute router: serving \S+ on (http://\S+) ").group(1)
        router.drain()
        yield router, url


def _route(r: httpx.Response) -> dict[str, str]:
    """The x-kvroute-route header's fields: engine, cached (predicted), reason."""
    return dict(part.strip().split("=", 1) for part in r.headers["x-kvroute-route"].split(";"))


def _kv_batches(http: httpx.Client, engine: str) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("kvroute_kv_event_batches") and f'engine="{engine}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _complete(http: httpx.Client, prompt: str) -> httpx.Response:
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
    assert r.status_code == 200, r.text
    return r


def test_a_killed_router_restarted_readopts_engines_with_their_kv_feeds(tmp_path: Path) -> None:
    with ExitStack() as stack:
        sims = {name: stack.enter_context(started(_sim(tmp_path, name))) for name in NAMES}
        with _router(tmp_path) as (first, url):
            for sim in sims.values():
                sim.wait_for(r"sim-engine INFO ready: rank 0")
                sim.drain()
            eventually(lambda: len(re.findall(r"engine ready engine=\w .*kv_events=True",
                                              first.text)) == 2)
            with httpx.Client(base_url=url, timeout=60) as http:
                home = _route(_complete(http, PROMPT))["engine"]
                # Its blocks announced (KV events), a second request is a prefix hit there.
                eventually(lambda: int(_route(_complete(http, PROMPT))["cached"]) > 0)
                # Under load: streams on both engines when the router dies.
                for i in range(4):
                    stack.enter_context(httpx.stream(
                        "POST", f"{url}/v1/completions", timeout=60, json={
                            "model": MODEL, "prompt": f"load {i}", "max_tokens": 2000,
                            "stream": True}))
            first.popen.kill()
            first.popen.wait(EXIT_TIMEOUT)

        with _router(tmp_path) as (second, url):
            # Re-adopted (no handshake: the same processes reconnect) with KV feeds, from the
            # kept ready maps; none was given on the command line.
            for name in NAMES:
                eventually(lambda name=name: re.search(
                    rf"engine ready engine={name} .*adopted=True kv_events=True", second.text)
                    is not None)
            with httpx.Client(base_url=url, timeout=60) as http:
                # The feed replays the engine's buffer at once (no request needed) ...
                eventually(lambda: _kv_batches(http, home) > 0)
                # ... and rebuilds the index: the first request after the restart is already a
                # predicted prefix hit, on the engine that holds the blocks.
                r = _complete(http, PROMPT)
                route = _route(r)
                assert route["engine"] == home and int(route["cached"]) > 0, route
                # ... and a real one: the engine kept its cache (it never restarted).
                details = r.json()["usage"].get("prompt_tokens_details") or {}
                assert details.get("cached_tokens", 0) > 0, r.json()["usage"]
        for sim in sims.values():
            assert sim.popen.poll() is None  # never restarted ...
            assert sim.text.count("ready: rank 0") == 1  # ... nor handshook again


def test_the_memory_is_per_engine_and_address_and_best_effort(tmp_path: Path) -> None:
    memory = EngineMemory(tmp_path / "state")
    a = EngineSpec("a", f"ipc://{tmp_path}/a.hs")
    ready = EngineReadyResponse(max_model_len=4096, block_size=16,
                                kv_events_config={"endpoint": "tcp://*:5557"})
    assert memory.recall(a) is None
    memory.remember(a, ready)
    assert memory.recall(a) == ready
    # Another name on that address, or that name elsewhere: not this engine's memory.
    assert memory.recall(EngineSpec("z", a.handshake)) is None
    assert memory.recall(EngineSpec("a", f"ipc://{tmp_path}/other.hs")) is None
    # Pods describe themselves over HTTP; no state directory keeps nothing.
    pod = EngineSpec("p", url="http://127.0.0.1:1")
    memory.remember(pod, ready)
    assert memory.recall(pod) is None
    assert EngineMemory(None).recall(a) is None
    # A directory that cannot be written costs the memory, not the caller.
    blocked = tmp_path / "file"
    blocked.write_text("")
    EngineMemory(blocked).remember(a, ready)
    assert EngineMemory(blocked).recall(a) is None


def test_the_state_directory_defaults_to_xdg_state(tmp_path: Path) -> None:
    args = ["--engine", "a=ipc:///x.hs"]
    env = {"XDG_STATE_HOME": str(tmp_path), "HOME": "/nonexistent"}
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert from_args(parser.parse_args(args), env).state_dir == str(tmp_path / "kvroute")
    assert from_args(parser.parse_args(args), {"HOME": "/h"}).state_dir == \
        "/h/.local/state/kvroute"
    assert from_args(parser.parse_args([*args, "--state-dir", ""]), env).state_dir is None
    assert from_args(parser.parse_args([*args, "--state-dir", "/s"]), env).state_dir == "/s"
