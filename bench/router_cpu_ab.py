"""Router CPU per token-in request, source trees side by side: each tree's `kvroute router` in front
of its own zero-time sim engine, all alive at once, requests alternating one by one between them.

    git worktree add /tmp/before <commit> && ln -s "$PWD/.venv" /tmp/before/.venv
    .venv/bin/python bench/router_cpu_ab.py /tmp/before . --http-server uvicorn --rounds 5

Each round sends ``--requests`` token-in requests (256 random ids, max_tokens=1) to every tree in
turn (the order flips every request), so a shared machine's load drifts hit all trees alike; per
round and tree: client p50 and p99, the router process's CPU per request and its main (event
loop) thread's. The medians of the rounds are the result; each tree's router runs from that tree.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

import msgspec  # noqa: E402
import psutil  # noqa: E402

from bench.httpload import build_request, read_response  # noqa: E402
from bench.router import pct, spawn_engine, start_router_flags  # noqa: E402
from serving.server import ROUTER_SERVER, SERVERS  # noqa: E402

ZERO = ("--step-time", "0", "--prefill-time-per-token", "0")


def start_router(tree: Path, engine: str, server: str) -> tuple[subprocess.Popen[bytes], int]:
    return start_router_flags(["--http-server", server, "--engine", engine], tree)


class Side:
    """One tree: its router, engine and keep-alive connection."""

    def __init__(self, tree: Path, tmp: Path, k: int, server: str) -> None:
        self.tree = tree
        self.engine = spawn_engine(tmp, f"e{k}", *ZERO)
        self.router, self.port = start_router(tree, f"e{k}=ipc://{tmp}/e{k}.hs", server)
        self.proc = psutil.Process(self.router.pid)
        self.rounds: list[tuple[float, float, float, float]] = []

    async def connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)

    async def one(self, request_id: str, ids: list[int]) -> float:
        body = msgspec.json.encode({"request_id": request_id, "token_ids": ids,
                                    "sampling_params": {"max_tokens": 1, "temperature": 0.0}})
        t0 = time.perf_counter()
        self.writer.write(build_request("127.0.0.1", self.port, "POST",
                                        "/inference/v1/generate", body))
        status, data = await read_response(self.reader)
        if status != 200:
            raise RuntimeError(f"{self.tree}: {status} {data[:200]!r}")
        return time.perf_counter() - t0

    def cpu(self) -> tuple[float, float]:
        """Process CPU and main-thread CPU, seconds."""
        main = next(t for t in self.proc.threads() if t.id == self.proc.pid)
        return sum(self.proc.cpu_times()[:2]), main.user_time + main.system_time

    def close(self) -> None:
        self.writer.close()
        for p in (self.router, self.engine):
            p.terminate()
            p.wait(30)


async def run(trees: list[Path], server: str, n: int, rounds: int, warmup: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="kvr-cpu-ab-"))
    sides = [Side(tree, tmp, k, server) for k, tree in enumerate(trees)]
    try:
        for side in sides:
            await side.connect()
        rng = random.Random(0)
        seq = 0
        for r in range(-1, rounds):  # round -1: the warm-up, not recorded
            count = warmup if r < 0 else n
            lat: list[list[float]] = [[] for _ in sides]
            before = [side.cpu() for side in sides]
            for i in range(count):
                ids = [rng.randrange(1000, 100000) for _ in range(256)]
                order = range(len(sides)) if i % 2 == 0 else range(len(sides) - 1, -1, -1)
                for k in order:
                    seq += 1
                    lat[k].append(await sides[k].one(f"ab-{seq}", ids))
            if r < 0:
                continue
            for k, side in enumerate(sides):
                (c0, m0), (c1, m1) = before[k], side.cpu()
                p50 = statistics.median(lat[k]) * 1e3
                p99 = pct(lat[k], 0.99) * 1e3
                side.rounds.append((p50, (c1 - c0) / count * 1e3, (m1 - m0) / count * 1e3, p99))
                print(f"  round {r + 1} {side.tree}: p50 {p50:.3f} ms, p99 {p99:.3f} ms, CPU "
                      f"{side.rounds[-1][1]:.3f} ms/request (main thread "
                      f"{side.rounds[-1][2]:.3f})", flush=True)
        print(f"\n{server}, {rounds} rounds of {n} requests per tree, medians:")
        print("| tree | client p50 ms | client p99 ms | router CPU ms/request "
              "| main thread ms/request |")
        print("|---|---|---|---|---|")
        for side in sides:
            p50, cpu, main, p99 = (statistics.median(x[j] for x in side.rounds) for j in range(4))
            print(f"| {side.tree} | {p50:.3f} | {p99:.3f} | {cpu:.3f} | {main:.3f} |")
    finally:
        for side in sides:
            side.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trees", nargs="+", type=Path, help="source trees (each with .venv usable)")
    p.add_argument("--http-server", default=ROUTER_SERVER, choices=SERVERS)
    p.add_argument("--requests", type=int, default=1000, help="per tree and round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=300)
    a = p.parse_args()
    asyncio.run(run([t.resolve() for t in a.trees], a.http_server, a.requests, a.rounds,
                    a.warmup))


if __name__ == "__main__":
    main()
