"""The sim engine's time model end to end: each step takes what its plan says, not much more.

    .venv/bin/python bench/sim_timing.py [--slack-ms 50]

Four runs on an in-process sim engine (tests/test_sim_engine.py's frontend), each timed by wall
clock from ADD to the last output: a 128-token prompt cold and then warm (112 tokens cached) at
2 ms per computed prompt token, and 5 decode steps solo and with 8 requests at 4 ms per scheduled
request. The planned time is what the scheduler charges (the tests check those plans exactly);
each run must take at least that (the engine waited it out) and at most that plus the slack (the
simulation's own cost, which a loaded machine raises: why this is a benchmark, not a test).
Exits 1 if a run is out of its bounds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.test_sim_engine import Harness  # noqa: E402

PROMPT = list(range(1, 129))
PREFILL = {"step_time": 0.0, "prefill_time_per_token": 0.002, "block_size": 16,
           "num_gpu_blocks": 64}
DECODE = {"step_time": 0.0, "prefill_time_per_token": 0.0, "decode_time_per_seq": 0.004,
          "max_num_seqs": 8}


def timed(fe: Any, requests: dict[str, list[int]], max_tokens: int) -> float:
    t0 = time.perf_counter()
    for rid, prompt in requests.items():
        fe.add(rid, prompt, max_tokens=max_tokens, ignore_eos=True)
    fe.run(*requests)
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--slack-ms", type=float, default=50.0, help="allowed time over the plan")
    a = p.parse_args()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    runs: list[tuple[str, float, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for setup, cases in (
            (PREFILL, [("prefill cold", {"cold": PROMPT}, 1, 128 * 0.002, 0.0),
                       ("prefill warm", {"warm": PROMPT}, 1, 16 * 0.002, 0.0)]),
            # The ADDs reach the engine one by one: its first step may hold only the first.
            (DECODE, [("decode solo", {"solo": [1, 2, 3]}, 5, 5 * 0.004, 0.0),
                      ("decode batch of 8", {f"b{k}": [k + 1] * 3 for k in range(8)}, 5,
                       5 * 8 * 0.004, 7 * 0.004)]),
        ):
            base = Path(tempfile.mkdtemp(dir=tmp))
            h = Harness(ctx, base)
            try:
                fe = h.start(**setup)
                for name, requests, max_tokens, planned, early in cases:
                    runs.append((name, planned - early, planned, timed(fe, requests, max_tokens)))
            finally:
                h.stop()
    ctx.term()
    failed = False
    slack = a.slack_ms / 1e3
    for name, lower, planned, took in runs:
        ok = lower <= took <= planned + slack
        failed |= not ok
        print(f"{name:18s} planned {planned * 1e3:7.1f} ms  bound [{lower * 1e3:.1f}, "
              f"{(planned + slack) * 1e3:.1f}] ms  took {took * 1e3:7.1f} ms  "
              f"{'ok' if ok else 'OUT OF BOUNDS'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
