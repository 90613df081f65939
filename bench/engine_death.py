"""How soon the engine client declares a SIGKILLed engine dead: within dead_after + 1 s.

    .venv/bin/python bench/engine_death.py [--rounds 3] [--dead-after 1.0] [--slack 1.0]

A simulated engine process (tests/engines.py) streams a long request; it is SIGKILLed (no
ENGINE_CORE_DEAD) and the time until the stream fails with EngineDeadError is measured, each
round with a fresh engine. The client notices the dropped connection at once
(router/link/engine_health.py); the bound is still the silence deadline, ``dead_after`` plus
the slack (its checking interval and this machine's scheduling, which a loaded machine
stretches: a benchmark, not a test; tests/test_engine_client_faults.py checks that the dropped
connection ends the stream). Exits 1 if a round is over the bound.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from router.link.engine_client import EngineClient, EngineDeadError  # noqa: E402
from tests.engines import make_engine  # noqa: E402
from tests.test_engine_client import make_request, random_prompt  # noqa: E402


async def one_round(workdir: Path, dead_after: float) -> float:
    engine = make_engine("sim", "victim", workdir, step_time="0.01", block_size="16")
    try:
        async with EngineClient([engine.spec], dead_after=dead_after) as client:
            engine.spawn()
            await client.wait_ready(60.0)
            stream = await client.submit(engine.name, make_request(random_prompt(32), 5000))
            await anext(stream)
            engine.kill()
            killed = time.perf_counter()
            try:
                await asyncio.wait_for(stream.collect(), 60)
            except EngineDeadError:
                return time.perf_counter() - killed
            raise RuntimeError("the stream ended without EngineDeadError")
    finally:
        engine.kill()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dead-after", type=float, default=1.0)
    p.add_argument("--slack", type=float, default=1.0, help="seconds allowed past dead_after")
    a = p.parse_args()
    bound = a.dead_after + a.slack
    took = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            took.append(asyncio.run(one_round(Path(tmp) / str(r), a.dead_after)))
    worst = max(took)
    print(f"death detected after {', '.join(f'{t:.2f}' for t in took)} s "
          f"(dead_after {a.dead_after:g} s); bound {bound:g} s; worst {worst:.2f} s: "
          f"{'ok' if worst <= bound else 'OVER THE BOUND'}")
    return 0 if worst <= bound else 1


if __name__ == "__main__":
    sys.exit(main())
