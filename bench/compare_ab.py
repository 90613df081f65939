"""A/B of kvroute configurations on one bench/compare.py workload, runs alternating.

    .venv/bin/python bench/compare_ab.py --workload pressure --repeats 3 \\
        --variant default= --variant tight-home=/tmp/home.toml

Each ``--variant NAME=FILE`` is kvroute cache_aware over HTTP with ``--config FILE`` added (empty:
none). One fleet of simulated engines (HTTP only, fresh caches before every run) serves every run,
and the variants take turns, so drift on the shared machine does not favour one. Prints each
run's hit rate and TTFT p50 / p99 (bench/compare.py's ``run_one``). Used for the causes named in
docs/benchmarks.md ("Router comparison"), e.g. a pod's scraped counts, a cold prompt's home bound.
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
from compare_routers import Launch  # noqa: E402
from compare_workloads import WORKLOADS, Spec, build  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="pressure", choices=WORKLOADS)
    p.add_argument("--variant", action="append", required=True, help="NAME=CONFIG_FILE")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--engines", type=int, default=4)
    a = p.parse_args(argv)
    variants = dict(v.split("=", 1) for v in a.variant)

    def launch(name: str, fleet: Fleet) -> Launch:
        spec = compare_routers.launch("kvroute-http", fleet, None)
        extra = ["--config", variants[name]] if variants[name] else []
        return dataclasses.replace(spec, cmd=[*spec.cmd, *extra], name=name)

    logs = Path(tempfile.mkdtemp(prefix="kvroute-ab-"))
    fleet = Fleet.plan(a.engines, compare.MODEL, SimTiming(), logs, zmq=False)
    wl = build(a.workload, Spec(compare.MODEL, 24.0, 15.0))
    progress = compare.Progress(a.repeats * len(variants))
    fleet.start()
    try:
        fleet.wait_healthy()
        for _ in range(a.repeats):
            for name in variants:
                progress.start(f"{a.workload} x {name}")
                compare.run_one(fleet, wl, name, None, logs, progress, launch(name, fleet))
    finally:
        fleet.stop()
    print(f"logs in {logs}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
