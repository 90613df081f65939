"""What rendering one of bench/compare.py's chats costs a pod: vLLM's render beside the sim's.

    .venv/bin/python bench/sim_render_cost.py [--requests 40] [--rounds 2]

bench/compare.py's pods are simulated engines; a router that sends them OpenAI text makes them
render it (vllm-router's cache_aware asks EVERY pod's /v1/chat/completions/render per request).
The sim renders with kvroute's own renderer unless started with ``--render-work vllm``. This
sets three servers side by side on the same chats (the first ``--requests`` of each compare
workload, in order, so shared prefixes recur as they do in the comparison), sent one at a time
to /v1/chat/completions/render: vLLM 0.32's own render server (`vllm launch render`, the Python
render a `vllm serve` pod runs), the sim as it was, and the sim with ``--render-work vllm``.
Per server and workload: server CPU per request (psutil, the process tree), rounds alternating;
the table is the median over rounds, and the ratios are each sim's against vLLM's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from compare_workloads import Spec, build  # noqa: E402
from httpload import run_in_process  # noqa: E402

# bench/render.py's server helpers (its name is the render package's: load it by path).
_spec = importlib.util.spec_from_file_location("render_bench", ROOT / "bench" / "render.py")
assert _spec is not None and _spec.loader is not None
_rb = sys.modules["render_bench"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_rb)
NAME, Server, free_port, start, wait_healthy = (
    _rb.NAME, _rb.Server, _rb.free_port, _rb.start, _rb.wait_healthy)

PATH = "/v1/chat/completions/render"
WORKLOADS = ("tenants", "multiturn", "agentic", "burst")
SERVERS = ("vllm", "sim", "sim-vllm-work")


def bodies(workload: str, count: int, model: str) -> list[bytes]:
    chats = build(workload, Spec(model, rate=8.0, seconds=60.0)).requests[:count]
    out = []
    for r in chats:
        body = json.loads(r.body)
        body["model"] = model
        out.append(json.dumps(body).encode())
    return out


def start_sim(name: str, logs: Path) -> Server:
    port = free_port()
    work = ["--render-work", "vllm"] if name == "sim-vllm-work" else []
    cmd = [sys.executable, "-m", "kvroute.cli", "sim-engine", "--port", str(port),
           "--served-model-name", NAME, *work]
    log = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    server = Server(name, proc, port)
    wait_healthy(server, 120)
    return server


def cpu_per_request(server: Server, chats: list[bytes]) -> float:
    run_in_process("127.0.0.1", server.port, chats[:3], concurrency=1, path=PATH, requests=3)
    c0 = server.cpu_seconds()
    stats = run_in_process("127.0.0.1", server.port, chats, concurrency=1, path=PATH,
                           requests=len(chats), max_seconds=120)
    if stats.errors:
        raise RuntimeError(f"{server.name}: {stats.errors} errors, first {stats.first_error}")
    return (server.cpu_seconds() - c0) / stats.sent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "sim_render_cost.json")
    args = p.parse_args(argv)
    chats = {w: bodies(w, args.requests, NAME) for w in WORKLOADS}
    logs = Path(tempfile.mkdtemp(prefix="kvroute-sim-render-"))
    servers: dict[str, Server] = {}
    try:
        servers["vllm"] = start("vllm-py", "0-1", 2, logs)
        for name in SERVERS[1:]:
            servers[name] = start_sim(name, logs)
        got: dict[str, dict[str, list[float]]] = {s: {w: [] for w in WORKLOADS} for s in SERVERS}
        for rnd in range(args.rounds):
            order = SERVERS[rnd % 3:] + SERVERS[:rnd % 3]
            for w in WORKLOADS:
                for s in order:
                    got[s][w].append(1e3 * cpu_per_request(servers[s], chats[w]))
                    print(f"round {rnd + 1} {w:9s} {s:14s} {got[s][w][-1]:7.2f} ms/render",
                          flush=True)
    finally:
        for server in servers.values():
            server.stop()
    med = {s: {w: statistics.median(v) for w, v in ws.items()} for s, ws in got.items()}
    print(f"\nserver CPU per render, ms (median of {args.rounds}); ratio to vLLM's render")
    print(f"{'workload':10s} {'vLLM':>8s} {'sim':>8s} {'ratio':>6s} {'sim-vllm-work':>14s} "
          f"{'ratio':>6s}")
    for w in WORKLOADS:
        v = med["vllm"][w]
        print(f"{w:10s} {v:8.2f} {med['sim'][w]:8.2f} {med['sim'][w] / v:6.3f} "
              f"{med['sim-vllm-work'][w]:14.2f} {med['sim-vllm-work'][w] / v:6.3f}")
    args.json.write_text(json.dumps({"requests": args.requests, "rounds": args.rounds,
                                     "ms_per_render": got, "median": med}, indent=1) + "\n")
    print(f"logs in {logs}; results in {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
