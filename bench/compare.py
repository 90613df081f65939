"""kvroute vs SGLang Model Gateway vs vllm-router on one simulated fleet, graded by the engines.

    .venv/bin/python bench/compare.py                       # the full comparison (~20 min)
    .venv/bin/python bench/compare.py --routers kvroute-http --workloads tenants \\
        --engines 2 --seconds 5 --scale 0.3 --no-rss     # a miniature (what the test runs)

One fleet of N simulated engines (bench/compare_fleet.py: both faces, real prefix caches and KV
events, step time growing with batch and uncached prompt tokens) serves every run; its pods make
each text request wait vLLM's render time, one at a time per pod (--render-work vllm-time; the
time measured first on vLLM's own render server, bench/compare_render_time.py), as a `vllm
serve` pod's API server renders before its engine sees the request. For each
workload (bench/compare_workloads.py) each router (bench/compare_routers.py) in turn is started
in front of the fleet with emptied caches, the same schedule of streamed chats is replayed at a
fixed rate (bench/compare_client.py), and the run is graded by:
  - the ENGINES' /metrics: prefix-cache hit rate in tokens, queue time and TTFT as the engine
    sees it, requests per engine (load spread);
  - the client: TTFT (first SSE event) p50/p99, errors;
  - the processes (psutil): router CPU per request and RSS, engines' CPU per request.
Then each router with caches emptied gets unique prompts back to back, and its RSS growth per
100k unique prompts is measured. Last, the CPU phase: a second fleet whose pods bill a text
request's render at what vLLM's render spends (kvroute sim-engine --render-work vllm; set beside
vLLM's own render server by bench/sim_render_cost.py) serves a few workloads at a low rate (the
2-core machine could not serve vllm-router's cache_aware, which makes every pod render every
request, at full rate with vLLM's render cost), and the total CPU per request across router and
pods is measured there. Results go to a JSON file, tables and the targets to stdout
(bench/compare_report.py), the figure to --plot. The order of routers rotates by workload so
drift on the shared machine does not always favour the same one.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import psutil  # noqa: E402
from compare_anchors import Anchors  # noqa: E402
from compare_client import run_in_process  # noqa: E402
from compare_fleet import Fleet, SimTiming  # noqa: E402
from compare_metrics import (  # noqa: E402
    RssSampler,
    cpu_seconds,
    merge,
    pct,
    rss_bytes,
)
from compare_render_time import RenderTime  # noqa: E402
from compare_render_time import measure as measure_render_time  # noqa: E402
from compare_report import markdown, plot  # noqa: E402
from compare_routers import (  # noqa: E402
    ROUTERS,
    Launch,
    Running,
    anchors_for,
    launch,
    router_names,
)
from compare_workloads import WORKLOADS, Spec, Workload, build, chat, text  # noqa: E402

from bench.httpload import run_in_process as closed_loop  # noqa: E402

MODEL = "qwen3"
MB = 1024 * 1024
HIT_TOKENS = 256  # a request counts as a hit when the engine found this many prompt tokens cached
RSS_ROUTERS = ("kvroute-http", "sglang", "vllm-cache")
CPU_ROUTERS = ("kvroute-http", "kvroute-zmq", "sglang", "vllm-cache", "vllm-kv")
CPU_WORKLOADS = ("tenants", "agentic")
KVROUTE_TOKEN_IN = ("kvroute-http", "kvroute-zmq", "kvroute-rr")  # its pods render nothing


class Progress:
    """One status line on stderr, rewritten while a run goes; a summary line per finished run."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.index = 0
        self.t0 = time.monotonic()
        self.tty = sys.stderr.isatty()

    def start(self, label: str) -> None:
        self.index += 1
        self.label = label
        self.update("starting")

    def update(self, status: str) -> None:
        line = (f"[{self.index}/{self.total} {time.monotonic() - self.t0:5.0f}s] "
                f"{self.label}: {status}")
        if self.tty:
            print("\r\x1b[2K" + line, end="", file=sys.stderr, flush=True)

    def done(self, summary: str) -> None:
        if self.tty:
            print("\r\x1b[2K", end="", file=sys.stderr)
        print(f"[{self.index}/{self.total} {time.monotonic() - self.t0:5.0f}s] {self.label}: "
              f"{summary}", file=sys.stderr, flush=True)


def link_fleet(fleet: Fleet, logs: Path) -> None:
    """Engines with a ZMQ face serve nothing before a ZMQ frontend linked them: one does, once."""
    boot = Running(launch("kvroute-zmq", fleet, None), logs / "fleet-link.log")
    try:
        boot.wait_ready()
    finally:
        boot.stop()


def run_one(fleet: Fleet, wl: Workload, name: str, anchors: Anchors | None, logs: Path,
            progress: Progress, spec: Launch | None = None) -> dict[str, Any]:
    """One router (``spec``, else the named one) in front of the fleet for one workload."""
    fleet.reset()
    router = Running(spec or launch(name, fleet, anchors), logs / f"{wl.name}-{name}.log")
    try:
        ready_s = router.wait_ready()
        ps = psutil.Process(router.proc.pid)
        # Warm the router (first-request work: tokenizer loads, connections to each engine),
        # then empty the caches again: every run starts cold in cache, warm in process.
        progress.update("warm-up")
        warm = warmup_schedule(len(fleet.engines))
        run_in_process("127.0.0.1", router.spec.port, warm, lambda d, e: None, timeout=120.0)
        fleet.reset()
        before, cpu_r0, cpu_e0 = fleet.snapshot(), cpu_seconds(ps), fleet.cpu()
        renders0 = fleet.renders()
        rss_start = rss_bytes(ps)
        schedule = [(r.at, r.body) for r in wl.requests]
        last = wl.requests[-1].at if wl.requests else 0.0

        def on_progress(done: int, errors: int) -> None:
            progress.update(f"{done}/{len(schedule)} answered, {errors} errors")

        with RssSampler(ps) as rss:
            results = run_in_process("127.0.0.1", router.spec.port, schedule, on_progress,
                                     timeout=last + 180.0)
        after, cpu_r1, cpu_e1 = fleet.snapshot(), cpu_seconds(ps), fleet.cpu()
        renders1 = fleet.renders()
    finally:
        router.stop()
    fleet.check_alive()
    deltas = [a.minus(b) for a, b in zip(after, before, strict=True)]
    fleet_delta = merge(deltas)
    c = fleet_delta.counters
    queries = c.get("vllm:prefix_cache_queries_total", 0.0)
    hits = c.get("vllm:prefix_cache_hits_total", 0.0)
    ok = [r for r in results if r.error is None]
    ttfts = [r.ttft for r in ok if r.ttft == r.ttft]
    per_engine = [d.hists["vllm:time_to_first_token_seconds"].count for d in deltas]
    n = max(len(results), 1)
    ttft_h = fleet_delta.hists["vllm:time_to_first_token_seconds"]
    queue_h = fleet_delta.hists["vllm:request_queue_time_seconds"]
    engine_cpu = sum(cpu_e1) - sum(cpu_e0)
    out = {
        "requests": len(results), "errors": len(results) - len(ok),
        "first_error": next((r.error for r in results if r.error is not None), None),
        "hit_rate": hits / queries if queries else float("nan"),
        "prompt_tokens": c.get("vllm:prompt_tokens_total", 0.0),
        "ttft_p50_ms": pct(ttfts, 0.50) * 1e3, "ttft_p99_ms": pct(ttfts, 0.99) * 1e3,
        "ttft_mean_ms": sum(ttfts) / len(ttfts) * 1e3 if ttfts else float("nan"),
        "latency_p50_ms": pct([r.latency for r in ok], 0.50) * 1e3,
        "max_send_lag_ms": max((r.late for r in results), default=0.0) * 1e3,
        "engine_ttft_mean_ms": ttft_h.mean * 1e3, "engine_ttft_p50_ms": ttft_h.quantile(0.5) * 1e3,
        "engine_ttft_p99_ms": ttft_h.quantile(0.99) * 1e3,
        "engine_queue_mean_ms": queue_h.mean * 1e3,
        "engine_queue_p99_ms": queue_h.quantile(0.99) * 1e3,
        "requests_per_engine": per_engine,
        "load_spread": max(per_engine) / (sum(per_engine) / len(per_engine))
        if sum(per_engine) else float("nan"),
        "router_cpu_ms_per_req": (cpu_r1 - cpu_r0) / n * 1e3,
        "engine_cpu_ms_per_req": engine_cpu / n * 1e3,
        "total_cpu_ms_per_req": (cpu_r1 - cpu_r0 + engine_cpu) / n * 1e3,
        # Pods at vLLM's render cost: the renders they did (the CPU phase) or waited (the
        # latency runs' --render-work vllm-time) per request, and the wait per request.
        "pod_renders_per_req": (renders1[0] - renders0[0]) / n,
        "pod_render_wait_ms_per_req": (renders1[1] - renders0[1]) / n * 1e3,
        "router_rss_start_mb": rss_start / MB, "router_rss_peak_mb": rss.peak / MB,
        "router_rss_end_mb": rss.last / MB, "router_ready_s": ready_s,
        # The slowest first tokens and when they were due: a cold start or a burst shows here.
        "slowest_ttft": [(round(r.at, 2), round(r.ttft * 1e3, 1)) for r in
                         sorted(ok, key=lambda r: -r.ttft if r.ttft == r.ttft else 0)[:5]],
    }
    # Per request, in schedule order: when it was due, its TTFT, and kvroute's own decision
    # (x-kvroute-route: engine, predicted cached tokens, reason; empty for the other routers).
    # The engine's own cached tokens for the request follow its TTFT (-1: not reported).
    (logs / f"{wl.name}-{name}-requests.tsv").write_text("".join(
        f"{i}\t{r.at:.3f}\t{r.ttft * 1e3:.1f}\t{r.cached}\t{r.route}\n"
        for i, r in enumerate(results)))
    out["engine_hit_requests"] = sum(r.cached >= HIT_TOKENS for r in ok)
    if any(r.route for r in results):
        routes = [(dict(p.strip().split("=", 1) for p in r.route.split(";")), r.cached)
                  for r in results if r.route]
        out["route_reasons"] = dict(Counter(d.get("reason", "?") for d, _ in routes))
        # kvroute's prediction (x-kvroute-route cached=) against what the engine then found.
        out["prediction"] = dict(Counter(
            _graded(int(d.get("cached", 0)), cached) for d, cached in routes if cached >= 0))
    progress.done(f"hit {out['hit_rate']:.3f}, TTFT p50 {out['ttft_p50_ms']:.1f} ms p99 "
                  f"{out['ttft_p99_ms']:.1f} ms, {out['errors']} errors, router "
                  f"{out['router_cpu_ms_per_req']:.2f} ms CPU/req, "
                  f"{out['router_rss_peak_mb']:.0f} MB")
    return out


def _graded(predicted: int, cached: int) -> str:
    """kvroute's predicted cached tokens against the engine's count, within a block."""
    block = SimTiming().block_size
    if predicted > cached + block:
        return "over"  # predicted a hit the engine no longer (or never) held
    if predicted < cached - block:
        return "under"  # the engine held more than predicted
    return "right"


def fleet_warmup_bodies(scale: float = 1.0, rounds: int = 3) -> list[bytes]:
    """Long prompts (1500 and 6000 tokens at scale 1, as the workloads') that warm a fresh
    fleet."""
    rng = random.Random(98)
    return [chat([{"role": "user", "content": f"fleet warm-up {i}" + text(rng, round(n * scale))}],
                 MODEL, 4) for i in range(rounds) for n in (1500, 6000)]


def warmup_schedule(engines: int) -> list[tuple[float, bytes]]:
    """Short chats unrelated to any workload, a few per engine, in two waves."""
    rng = random.Random(99)
    bodies = [chat([{"role": "user", "content": f"warm-up {i}" + text(rng, 100)}], MODEL, 4)
              for i in range(4 * engines)]
    return [(0.5 * (i % 2), b) for i, b in enumerate(bodies)]


def unique_bodies(count: int, tokens: int, seed: int = 7) -> list[bytes]:
    """Non-streamed chats, each with a prompt of its own."""
    rng = random.Random(seed)
    return [json.dumps({"model": MODEL, "messages": [
        {"role": "user", "content": f"{i}" + text(rng, tokens)}], "max_tokens": 1,
        "temperature": 0}).encode() for i in range(count)]


def rss_growth(fleet: Fleet, name: str, anchors: Anchors | None, logs: Path, seconds: float,
               bodies: list[bytes], progress: Progress) -> dict[str, Any]:
    """RSS growth while ``bodies`` (unique prompts) go through back to back, after a warm-up."""
    fleet.reset()
    router = Running(launch(name, fleet, anchors), logs / f"rss-{name}.log")
    try:
        router.wait_ready()
        ps = psutil.Process(router.proc.pid)
        warm = 200
        progress.update("warm-up")
        closed_loop("127.0.0.1", router.spec.port, bodies[:warm], concurrency=8,
                    path="/v1/chat/completions", requests=warm, max_seconds=60)
        rss0 = rss_bytes(ps)
        progress.update(f"unique prompts for {seconds:.0f} s")
        stats = closed_loop("127.0.0.1", router.spec.port, bodies[warm:], concurrency=16,
                            path="/v1/chat/completions", requests=len(bodies) - warm,
                            max_seconds=seconds)
        rss1 = rss_bytes(ps)
    finally:
        router.stop()
    if stats.errors:  # a growth measured on refused requests measures nothing
        raise RuntimeError(f"{name}: {stats.errors} of {stats.sent} unique prompts failed "
                           f"(log: {logs / f'rss-{name}.log'})")
    sent = max(stats.sent, 1)
    out = {"requests": stats.sent, "errors": stats.errors, "rss_before_mb": rss0 / MB,
           "rss_after_mb": rss1 / MB, "mb_per_100k": (rss1 - rss0) / MB / sent * 1e5}
    progress.done(f"{stats.sent} unique prompts ({stats.errors} errors), RSS "
                  f"{out['rss_before_mb']:.0f} -> {out['rss_after_mb']:.0f} MB, "
                  f"{out['mb_per_100k']:.1f} MB per 100k")
    return out


def bring_up(fleet: Fleet, logs: Path, scale: float = 1.0) -> None:
    """Start the fleet, link it once if it has a ZMQ face (such engines serve nothing before a
    ZMQ frontend linked them), wait until every engine serves, and warm it."""
    fleet.start()
    if fleet.zmq:
        link_fleet(fleet, logs)
    fleet.wait_healthy()
    fleet.warm(fleet_warmup_bodies(scale))


def run_workloads(fleet: Fleet, routers: list[str], workloads: list[str], spec: Spec,
                  anchors: Anchors | None, logs: Path, progress: Progress,
                  label: str = "") -> dict[str, Any]:
    """Every router on every workload, the order of routers rotated by workload."""
    out: dict[str, Any] = {}
    for i, wl_name in enumerate(workloads):
        wl = build(wl_name, spec)
        runs = {}
        for name in routers[i % len(routers):] + routers[:i % len(routers)]:
            progress.start(f"{label}{wl_name} x {name}")
            runs[name] = run_one(fleet, wl, name, anchors, logs, progress)
        out[wl_name] = {r: runs[r] for r in routers}
    return out


def cpu_phase(engines: int, routers: list[str], workloads: list[str], spec: Spec,
              anchors: Anchors | None, logs: Path, progress: Progress) -> dict[str, Any]:
    """Each router on each workload in front of a fleet whose pods spend vLLM's render CPU on
    every text request (--render-work vllm), at ``spec``'s (low) rate: total CPU per request."""
    fleet = Fleet.plan(engines, MODEL, SimTiming(), logs, zmq="kvroute-zmq" in routers,
                       render_work="vllm")
    try:
        progress.start("fleet at vLLM's render cost")
        bring_up(fleet, logs, spec.scale)
        progress.done(f"{engines} engines up")
        return run_workloads(fleet, routers, workloads, spec, anchors, logs, progress, "CPU: ")
    finally:
        fleet.stop()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--routers", default=",".join(ROUTERS))
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--seconds", type=float, default=15.0, help="schedule length per run")
    p.add_argument("--rate", type=float, default=24.0, help="requests per second")
    p.add_argument("--scale", type=float, default=1.0, help="prompt sizes and counts")
    p.add_argument("--rss-seconds", type=float, default=20.0)
    p.add_argument("--rss-routers", default=",".join(RSS_ROUTERS))
    p.add_argument("--no-rss", action="store_true", help="skip the RSS-growth runs")
    p.add_argument("--pod-render", choices=("vllm-time", "kvroute"), default="vllm-time",
                   help="what a text request costs the latency runs' pods: vllm-time (default): "
                        "it waits vLLM's render time for its prompt, one at a time per pod; "
                        "kvroute: kvroute's renderer alone (a few %% of vLLM's)")
    p.add_argument("--render-time", metavar="BASE_MS,US_PER_TOKEN", type=RenderTime.parse,
                   help="vLLM's render time for --pod-render vllm-time (default: measured at "
                        "the start on vLLM's own render server, bench/compare_render_time.py)")
    p.add_argument("--cpu-routers", default=",".join(CPU_ROUTERS))
    p.add_argument("--cpu-workloads", default=",".join(CPU_WORKLOADS))
    p.add_argument("--cpu-rate", type=float, default=6.0,
                   help="requests per second in the CPU phase (pods at vLLM's render cost)")
    p.add_argument("--cpu-seconds", type=float, default=12.0)
    p.add_argument("--no-cpu", action="store_true", help="skip the CPU phase")
    p.add_argument("--json", default=str(ROOT / "bench" / "results" / "compare.json"))
    p.add_argument("--plot", help="write the figure here (PNG)")
    p.add_argument("--logs", help="keep the processes' logs here (default: a temp dir)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    routers = router_names(a.routers)
    workloads = [w for w in a.workloads.split(",") if w]
    rss_routers = [] if a.no_rss else router_names(a.rss_routers)
    cpu_routers = [] if a.no_cpu else router_names(a.cpu_routers)
    cpu_workloads = [w for w in a.cpu_workloads.split(",") if w] if cpu_routers else []
    for w in (*workloads, *cpu_workloads):
        if w not in WORKLOADS:
            raise SystemExit(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    anchors = anchors_for((*routers, *rss_routers, *cpu_routers))
    logs = Path(a.logs) if a.logs else Path(tempfile.mkdtemp(prefix="kvroute-compare-"))
    logs.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")
    t0 = time.monotonic()
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    spec = Spec(MODEL, a.rate, a.seconds, scale=a.scale)
    print(f"== {len(workloads)} workloads x {len(routers)} routers on {a.engines} sim engines, "
          f"{a.seconds:.0f} s at {a.rate:g} req/s each (logs in {logs})", file=sys.stderr)
    zmq = "kvroute-zmq" in (*routers, *rss_routers)
    # Only routers that send text make the pods render: without one the pods' render is moot.
    timed = a.pod_render == "vllm-time" and any(r not in KVROUTE_TOKEN_IN for r in routers)
    result: dict[str, Any] = {"runs": {}, "rss_growth": {}, "cpu_runs": {}}
    progress = Progress(len(workloads) * len(routers) + len(rss_routers) + 1 + int(timed)
                        + (len(cpu_workloads) * len(cpu_routers) + 1 if cpu_routers else 0))
    render_time: RenderTime | None = None
    if timed:
        progress.start("vLLM's render time")
        render_time = a.render_time or measure_render_time(logs / "render-time")
        progress.done(f"{render_time.base_ms:.2f} ms + {render_time.us_per_token:.2f} us a "
                      "prompt token")
    fleet = Fleet.plan(a.engines, MODEL, SimTiming(), logs, zmq=zmq,
                       render_work="vllm-time" if render_time else "kvroute",
                       render_time=render_time.flag() if render_time else None)
    try:
        progress.start("fleet")
        bring_up(fleet, logs, a.scale)
        progress.done(f"{a.engines} engines up")
        result["runs"] = run_workloads(fleet, routers, workloads, spec, anchors, logs, progress)
        if rss_routers:
            bodies = unique_bodies(int(a.rss_seconds * 600) + 200, round(300 * a.scale))
            for name in rss_routers:
                progress.start(f"unique prompts x {name}")
                result["rss_growth"][name] = rss_growth(fleet, name, anchors, logs,
                                                        a.rss_seconds, bodies, progress)
    finally:
        fleet.stop()
    if cpu_routers:
        cpu_spec = Spec(MODEL, a.cpu_rate, a.cpu_seconds, scale=a.scale)
        result["cpu_runs"] = cpu_phase(a.engines, cpu_routers, cpu_workloads, cpu_spec, anchors,
                                       logs / "cpu", progress)
    result["meta"] = {
        "started": started, "elapsed_s": time.monotonic() - t0, "load_before": load_before,
        "load_after": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "engines": a.engines, "seconds": a.seconds, "rate": a.rate, "scale": a.scale,
        "timing": dataclasses.asdict(SimTiming()), "routers": routers, "workloads": workloads,
        "cpu_rate": a.cpu_rate, "cpu_seconds": a.cpu_seconds,
        "pod_render": fleet.render_work,
        "render_time": dataclasses.asdict(render_time) if render_time else None,
        "command": " ".join(["bench/compare.py", *(argv if argv is not None else sys.argv[1:])]),
    }
    out = Path(a.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, allow_nan=True) + "\n")
    print(markdown(result))
    if a.plot:
        plot(result, Path(a.plot))
    print(f"== results in {out}" + (f", figure in {a.plot}" if a.plot else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
