"""A/B of kvroute configurations on one bench/compare.py workload, runs alternating.

    .venv/bin/python bench/compare_ab.py --workload pressure --repeats 3 \\
        --variant default= --variant tight-home=/tmp/home.toml

Each ``--variant NAME=FILE`` is kvroute cache_aware over HTTP with ``--config FILE`` added (empty:
none); ``--variant NAME=router:ROUTER`` is one of bench/compare.py's routers as that harness
starts it (``router:kvroute-rr``, kvroute's round robin: the floor a cache-aware p99 must beat;
``router:kvroute-zmq``; ``router:oracle``; an anchor, ``router:sglang``, ``router:vllm-cache``,
``router:vllm-kv``, installed as bench/compare.py installs them). One fleet of simulated engines
(fresh caches before every run) serves every run, and the variants take turns, so drift on the
shared machine does not favour one. Where a variant sends text (an anchor, the oracle), the pods
wait vLLM's render time for it as in bench/compare.py's latency runs (``--render-time``, else
measured first on vLLM's render server). Prints each run's hit rate and TTFT p50 / p99 as it
ends (bench/compare.py's ``run_one``), and at the end a table of every run's, with the requests
the engines found >= 256 tokens cached and the router's and the engines' CPU per request. Used
for the causes named in docs/benchmarks.md ("Router comparison"), e.g. a pod's scraped counts,
a cold prompt's home bound, and to tell a single run's gap to an anchor from the runs' spread.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import compare  # noqa: E402
import compare_routers  # noqa: E402
from compare_fleet import Fleet, SimTiming  # noqa: E402
from compare_render_time import RenderTime  # noqa: E402
from compare_render_time import measure as measure_render_time  # noqa: E402
from compare_routers import Launch  # noqa: E402
from compare_workloads import WORKLOADS, Spec, build  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="pressure", choices=WORKLOADS)
    p.add_argument("--variant", action="append", required=True,
                   help="NAME=CONFIG_FILE or NAME=router:ROUTER")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--rate", type=float, default=24.0, help="requests per second")
    p.add_argument("--seconds", type=float, default=15.0, help="schedule length per run")
    p.add_argument("--zmq-fleet", action="store_true",
                   help="the engines serve their ZMQ face too, as in bench/compare.py's fleet")
    p.add_argument("--history", default="",
                   help="workloads (comma-separated) run first through the first variant, so the "
                        "engines' KV event buffers are as full as late in a full compare run")
    p.add_argument("--render-time", metavar="BASE_MS,US_PER_TOKEN", type=RenderTime.parse,
                   help="vLLM's render time the pods wait for a text request (default: measured "
                        "on vLLM's render server when a variant sends text)")
    a = p.parse_args(argv)
    unknown = [h for h in a.history.split(",") if h and h not in WORKLOADS]
    if unknown:
        p.error(f"unknown --history workload(s) {', '.join(unknown)}; choose from "
                f"{', '.join(WORKLOADS)}")
    variants = dict(v.split("=", 1) for v in a.variant)

    routers = {name: v.removeprefix("router:") for name, v in variants.items()
               if v.startswith("router:")}
    anchors = compare_routers.anchors_for(compare_routers.router_names(",".join(routers.values())))

    def launch(name: str, fleet: Fleet) -> Launch:
        if name in routers:
            return dataclasses.replace(compare_routers.launch(routers[name], fleet, anchors),
                                       name=name)
        spec = compare_routers.launch("kvroute-http", fleet, None)
        extra = ["--config", variants[name]] if variants[name] else []
        return dataclasses.replace(spec, cmd=[*spec.cmd, *extra], name=name)

    logs = Path(tempfile.mkdtemp(prefix="kvroute-ab-"))
    # As bench/compare.py: pods wait vLLM's render time only where some router sends them text.
    texts = any(r not in compare.KVROUTE_TOKEN_IN for r in routers.values())
    render_time = (a.render_time or measure_render_time(logs / "render-time")) if texts else None
    fleet = Fleet.plan(a.engines, compare.MODEL, SimTiming(), logs, zmq=a.zmq_fleet,
                       render_work="vllm-time" if render_time else "kvroute",
                       render_time=render_time.flag() if render_time else None)
    spec = Spec(compare.MODEL, a.rate, a.seconds)
    wl = build(a.workload, spec)
    history = [build(h, spec) for h in a.history.split(",") if h]
    progress = compare.Progress(a.repeats * len(variants) + len(history))
    try:
        compare.bring_up(fleet, logs)
        first = next(iter(variants))
        for h in history:
            progress.start(f"history: {h.name} x {first}")
            compare.run_one(fleet, h, first, None, logs, progress, launch(first, fleet))
        runs: dict[str, list[dict[str, object]]] = {name: [] for name in variants}
        for k in range(a.repeats):
            for name in variants:  # each run's logs apart: WORKLOAD-NAME-K-requests.tsv
                progress.start(f"{a.workload} x {name}")
                runs[name].append(compare.run_one(fleet, wl, f"{name}-{k}", None, logs,
                                                  progress, launch(name, fleet)))
    finally:
        fleet.stop()
    print(f"\n{a.workload}, {a.repeats} runs per variant, alternating (run by run):\n")
    print("| variant | hit rate | requests hit | TTFT p50 ms | TTFT p99 ms | router CPU ms/req "
          "| engines' CPU ms/req |")
    print("|---|---|---|---|---|---|---|")
    for name, rs in runs.items():
        def col(key: str, fmt: str, rs: list[dict[str, object]] = rs) -> str:
            return " / ".join(format(r[key], fmt) for r in rs)
        print(f"| {name} | {col('hit_rate', '.3f')} | {col('engine_hit_requests', 'd')} "
              f"| {col('ttft_p50_ms', '.0f')} "
              f"| {col('ttft_p99_ms', '.0f')} | {col('router_cpu_ms_per_req', '.2f')} "
              f"| {col('engine_cpu_ms_per_req', '.2f')} |")
    print(f"logs in {logs}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
