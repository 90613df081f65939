"""Each router's own time per request, requests one at a time: client TTFT minus engine TTFT.

    .venv/bin/python bench/compare_own_time.py [--routers kvroute-http,kvroute-zmq,sglang] \\
        [--requests 80] [--prompt-tokens 4000] [--rounds 2]

bench/compare.py found kvroute's TTFT p50 above SGLang's on the workloads of 4000-6000-token
prompts that hit (agentic, burst), where every router's request waits on an engine floor of a few
ms. This isolates the router's part with no queueing: ONE simulated engine (the fleet of
bench/compare_fleet.py, both faces), and for each router in turn (rotated per round) chats that
share an agentic-sized system prompt and differ in their user turn, sent one at a time, one every
``--gap`` seconds, after five that warm the router and fill the engine's cache. Per run: the
client's TTFT (first generated text) p50 and mean, the engine's own mean TTFT over the same
requests (its /metrics histogram: from its arrival to its first token), their difference (the
router's own time: reading, rendering and routing the request, the hop to the engine and the
first token's way back), and the router's and the engine's CPU per request (psutil).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import psutil  # noqa: E402
from compare import MODEL, bring_up  # noqa: E402
from compare_anchors import Anchors  # noqa: E402
from compare_client import run_in_process  # noqa: E402
from compare_fleet import Fleet, SimTiming  # noqa: E402
from compare_metrics import cpu_seconds, scrape  # noqa: E402
from compare_routers import Running, anchors_for, launch, router_names  # noqa: E402
from compare_workloads import chat, text  # noqa: E402

WARM = 5  # requests before the measured ones: the router's first, and the engine's cache fill


def bodies(count: int, prompt_tokens: int, seed: int = 11) -> list[bytes]:
    rng = random.Random(seed)
    system = "Agent tools:" + text(rng, prompt_tokens)
    return [chat([{"role": "system", "content": system},
                  {"role": "user", "content": f"Task {i}." + text(rng, 80)}], MODEL, 16)
            for i in range(count)]


def run(fleet: Fleet, name: str, anchors: Anchors | None, logs: Path, chats: list[bytes],
        gap: float) -> dict[str, float]:
    fleet.reset()
    router = Running(launch(name, fleet, anchors), logs / f"own-time-{name}.log")
    try:
        router.wait_ready()
        port = router.spec.port
        ps = psutil.Process(router.proc.pid)
        engine = fleet.engines[0]
        assert engine.ps is not None

        def send(part: list[bytes]) -> list[float]:
            results = run_in_process("127.0.0.1", port, [(i * gap, b) for i, b in enumerate(part)],
                                     lambda done, errors: None, timeout=300.0)
            bad = [r.error for r in results if r.status != 200]
            if bad:
                raise RuntimeError(f"{name}: {len(bad)} requests failed: {bad[0]}")
            return [r.ttft for r in results]

        send(chats[:WARM])
        before, cpu_r, cpu_e = scrape(engine.url), cpu_seconds(ps), cpu_seconds(engine.ps)
        ttfts = send(chats[WARM:])
        after = scrape(engine.url)
        n = len(ttfts)
        cpu_r, cpu_e = cpu_seconds(ps) - cpu_r, cpu_seconds(engine.ps) - cpu_e
    finally:
        router.stop()
    engine_ttft = after.minus(before).hists["vllm:time_to_first_token_seconds"].mean
    client = statistics.fmean(ttfts)
    return {"p50": statistics.median(ttfts) * 1e3, "mean": client * 1e3,
            "engine": engine_ttft * 1e3, "own": (client - engine_ttft) * 1e3,
            "router_cpu": cpu_r / n * 1e3, "engine_cpu": cpu_e / n * 1e3}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--routers", default="kvroute-http,kvroute-zmq,sglang")
    p.add_argument("--requests", type=int, default=80)
    p.add_argument("--prompt-tokens", type=int, default=4000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--gap", type=float, default=0.1, help="seconds between requests")
    a = p.parse_args(argv)
    names = router_names(a.routers)
    anchors = anchors_for(names)
    logs = Path(tempfile.mkdtemp(prefix="kvroute-own-time-"))
    chats = bodies(WARM + a.requests, a.prompt_tokens)
    fleet = Fleet.plan(1, MODEL, SimTiming(), logs)
    print(f"{'router':<14} {'TTFT p50':>9} {'mean':>7} {'engine':>7} {'own':>6} "
          f"{'router CPU/req':>15} {'engine CPU/req':>15}   (ms)", flush=True)
    try:
        bring_up(fleet, logs)  # warmed: a fresh engine's first long prompts cost more
        for k in range(a.rounds):
            for name in names[k % len(names):] + names[:k % len(names)]:
                r = run(fleet, name, anchors, logs, chats, a.gap)
                print(f"{name:<14} {r['p50']:>9.2f} {r['mean']:>7.2f} {r['engine']:>7.2f} "
                      f"{r['own']:>6.2f} {r['router_cpu']:>15.2f} {r['engine_cpu']:>15.2f}",
                      flush=True)
    finally:
        fleet.stop()
    print(f"logs in {logs}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
