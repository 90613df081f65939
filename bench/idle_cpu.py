"""Each router's CPU, and its pods', while no request comes: the fixed cost of running it.

    .venv/bin/python bench/idle_cpu.py [--routers kvroute-http,kvroute-zmq,vllm-cache,sglang] \\
        [--seconds 20] [--rounds 2]

The fleet of bench/compare.py's CPU phase (4 simulated engines, both faces), first with no router
in front, then each router in turn (rotated per round), started, ready, given 3 s to settle, and
measured over ``--seconds`` with psutil: the router process's CPU a second, and the pods' (what
the router's own control traffic, health probes and metric scrapes, costs them). bench/compare.py
spreads this over its CPU phase's requests (6 a second).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import psutil  # noqa: E402
from compare import MODEL, bring_up  # noqa: E402
from compare_fleet import Fleet, SimTiming  # noqa: E402
from compare_metrics import cpu_seconds  # noqa: E402
from compare_routers import Running, anchors_for, launch, router_names  # noqa: E402


def idle(fleet: Fleet, seconds: float, pid: int | None = None) -> tuple[float, float]:
    """(router, pods) CPU ms a second over ``seconds`` (router 0.0 when ``pid`` is None)."""
    ps = psutil.Process(pid) if pid is not None else None
    r0, e0 = cpu_seconds(ps) if ps else 0.0, sum(fleet.cpu())
    time.sleep(seconds)
    r1, e1 = cpu_seconds(ps) if ps else 0.0, sum(fleet.cpu())
    return (r1 - r0) / seconds * 1e3, (e1 - e0) / seconds * 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--routers", default="kvroute-http,kvroute-zmq,vllm-cache,sglang")
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args(argv)
    routers = router_names(a.routers)
    anchors = anchors_for(routers)
    logs = Path(tempfile.mkdtemp(prefix="kvroute-idle-"))
    fleet = Fleet.plan(a.engines, MODEL, SimTiming(), logs, zmq=True, render_work="vllm")
    try:
        bring_up(fleet, logs)
        print(f"| router | round | router CPU ms/s | {a.engines} pods' CPU ms/s |")
        print("|---|---|---|---|")
        _, pods = idle(fleet, a.seconds)
        print(f"| (none) | 0 | - | {pods:.1f} |", flush=True)
        for rnd in range(a.rounds):
            for name in routers[rnd % len(routers):] + routers[:rnd % len(routers)]:
                router = Running(launch(name, fleet, anchors), logs / f"idle-{name}.log")
                try:
                    router.wait_ready()
                    time.sleep(3.0)
                    own, pods = idle(fleet, a.seconds, router.proc.pid)
                finally:
                    router.stop()
                print(f"| {name} | {rnd + 1} | {own:.1f} | {pods:.1f} |", flush=True)
    finally:
        fleet.stop()
    print(f"logs: {logs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
