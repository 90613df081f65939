"""Sim-engine capacity: 1000 concurrent streams through one `kvroute sim-engine` process.

    .venv/bin/python bench/sim_engine.py [--streams 1000] [--prompt 256] [--tokens 64]

The engine runs with zero simulated step time, so every step costs only the simulation itself:
scheduling, the block pool, token generation, stop checks and the wire encoding. Measured: the
engine process's CPU time per output token and its decode-step rate with all streams running,
and that every stream got exactly its tokens. Anchor, measured side by side in the same run: a
protocol-only engine process that just encodes and pushes the same EngineCoreOutputs (same
streams, same tokens per step, same scheduler_stats map) — the floor any engine pays on this wire.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import psutil
import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.launch import spawn_sim_engine  # noqa: E402
from wire import engine as wire  # noqa: E402
from wire.sampling import SamplingParams  # noqa: E402

ANCHOR = r"""
import sys, time, msgspec, zmq
sys.path.insert(0, sys.argv[1])
from wire import engine as wire
out_addr, streams, tokens = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ctx = zmq.Context()
push = ctx.socket(zmq.PUSH)
push.connect(out_addr)
enc = msgspec.msgpack.Encoder(enc_hook=wire.enc_hook)
stats = {"num_running_reqs": streams, "num_waiting_reqs": 0, "kv_cache_usage": 0.5,
         "prefix_cache_stats": {"reset": False, "requests": 0, "queries": 0, "hits": 0}}
ids = [f"r{i}" for i in range(streams)]
cpu0 = time.process_time()
for step in range(tokens):
    fin = 1 if step == tokens - 1 else None
    outs = [wire.EngineCoreOutput(request_id=r, new_token_ids=[(i * 31 + step) % 32000],
                                  finish_reason=fin) for i, r in enumerate(ids)]
    push.send_multipart([enc.encode(wire.EngineCoreOutputs(outputs=outs, scheduler_stats=stats,
                                                           timestamp=time.monotonic()))])
push.close(linger=-1)
ctx.term()
print(time.process_time() - cpu0)
"""


class Frontend:
    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], base: str) -> None:
        self.hs_addr, self.in_addr, self.out_addr = (f"ipc://{base}/{n}" for n in ("h", "i", "o"))
        self.hs = ctx.socket(zmq.ROUTER)
        self.hs.bind(self.hs_addr)
        self.inp = ctx.socket(zmq.ROUTER)
        self.inp.bind(self.in_addr)
        self.out = ctx.socket(zmq.PULL)
        self.out.bind(self.out_addr)
        self.dec = msgspec.msgpack.Decoder(wire.EngineCoreOutputs, ext_hook=wire.ext_hook)
        self.enc = msgspec.msgpack.Encoder(enc_hook=wire.enc_hook)

    def handshake(self) -> bytes:
        assert self.hs.poll(60_000), "sim engine did not say HELLO"
        ident, _ = self.hs.recv_multipart()
        addrs = {"inputs": [self.in_addr], "outputs": [self.out_addr]}
        self.hs.send_multipart([ident, msgspec.msgpack.encode({"addresses": addrs})])
        assert self.inp.poll(60_000)
        engine_id, _ready = self.inp.recv_multipart()
        return bytes(engine_id)

    def collect(self, streams: int) -> tuple[dict[str, int], int, int]:
        """Tokens per request until ``streams`` requests finished; messages and stats seen."""
        got: dict[str, int] = {}
        finished = messages = 0
        while finished < streams:
            assert self.out.poll(60_000), "engine went silent"
            outs = self.dec.decode(self.out.recv_multipart()[0])
            messages += 1
            for o in outs.outputs:
                got[o.request_id] = got.get(o.request_id, 0) + len(o.new_token_ids)
                finished += o.finish_reason is not None
        return got, messages, finished


def run_sim(
    args: argparse.Namespace, ctx: zmq.Context[zmq.Socket[bytes]], base: str
) -> dict[str, float]:
    fe = Frontend(ctx, base)
    proc = spawn_sim_engine(
        fe.hs_addr,
        [
            "--vocab-size",
            "32000",
            "--step-time",
            "0",
            "--prefill-time-per-token",
            "0",
            "--block-size",
            "16",
            "--num-gpu-blocks",
            str(args.streams * (args.prompt + args.tokens) // 16 + 64),
            "--max-num-seqs",
            str(args.streams),
            "--max-num-batched-tokens",
            str(1 << 22),
            "--max-model-len",
            str(args.prompt + args.tokens + 16),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        engine_id = fe.handshake()
        ps = psutil.Process(proc.pid)
        cpu0 = sum(ps.cpu_times()[:2])
        t0 = time.perf_counter()
        shared = list(range(1, args.prompt // 2 + 1))
        params = SamplingParams(max_tokens=args.tokens, ignore_eos=True, temperature=0.0)
        for i in range(args.streams):
            prompt = shared + [(i * 7919 + k) % 31000 + 1 for k in range(args.prompt - len(shared))]
            req = wire.EngineCoreRequest(
                f"r{i}", prompt, None, params, None, time.time(), None, None, None
            )
            fe.inp.send_multipart([engine_id, wire.REQ_ADD, fe.enc.encode(req)])
        got, messages, finished = fe.collect(args.streams)
        wall = time.perf_counter() - t0
        cpu = sum(ps.cpu_times()[:2]) - cpu0
        # An idle engine must cost nothing: multi-engine runs put many of them on few cores.
        idle0 = sum(ps.cpu_times()[:2])
        time.sleep(2.0)
        idle = sum(ps.cpu_times()[:2]) - idle0
    finally:
        proc.terminate()
        proc.wait(10)
        for s in (fe.hs, fe.inp, fe.out):
            s.close(linger=0)
    lost = sum(1 for i in range(args.streams) if got.get(f"r{i}") != args.tokens)
    n = sum(got.values())
    return {
        "wall": wall,
        "cpu": cpu,
        "tokens": n,
        "steps": messages,
        "lost": lost,
        "finished": finished,
        "idle_cpu": idle,
    }


def run_anchor(
    args: argparse.Namespace, ctx: zmq.Context[zmq.Socket[bytes]], base: str
) -> dict[str, float]:
    out_addr = f"ipc://{base}/anchor"
    pull = ctx.socket(zmq.PULL)
    pull.bind(out_addr)
    dec = msgspec.msgpack.Decoder(wire.EngineCoreOutputs, ext_hook=wire.ext_hook)
    proc = subprocess.Popen(
        [sys.executable, "-c", ANCHOR, str(ROOT), out_addr, str(args.streams), str(args.tokens)],
        stdout=subprocess.PIPE,
    )
    n = 0
    assert pull.poll(60_000)
    t0 = time.perf_counter()
    for _ in range(args.tokens):
        assert pull.poll(60_000)
        outs = dec.decode(pull.recv_multipart()[0])
        n += sum(len(o.new_token_ids) for o in outs.outputs)
    wall = time.perf_counter() - t0
    stdout, _ = proc.communicate(timeout=10)
    cpu = float(stdout)  # the anchor's own CPU time: interpreter start and imports excluded
    pull.close(linger=0)
    return {"wall": wall, "cpu": cpu, "tokens": n}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--streams", type=int, default=1000)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--tokens", type=int, default=64)
    args = p.parse_args()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    with tempfile.TemporaryDirectory(prefix="kvsim") as base:
        sim = run_sim(args, ctx, base)
        anchor = run_anchor(args, ctx, base)
    ctx.term()
    sim_us = sim["cpu"] / sim["tokens"] * 1e6
    anchor_us = anchor["cpu"] / anchor["tokens"] * 1e6
    print(
        f"{args.streams} concurrent streams, prompt {args.prompt} tokens (half shared), "
        f"{args.tokens} output tokens each"
    )
    print(f"{'':<26}{'tokens':>9}{'wall s':>9}{'cpu s':>8}{'cpu us/tok':>12}{'tok/s':>10}")
    for name, r in (("sim engine", sim), ("anchor: protocol only", anchor)):
        print(
            f"{name:<26}{r['tokens']:>9.0f}{r['wall']:>9.2f}{r['cpu']:>8.2f}"
            f"{r['cpu'] / r['tokens'] * 1e6:>12.2f}{r['tokens'] / r['wall']:>10.0f}"
        )
    print(f"sim / anchor CPU per token: {sim_us / anchor_us:.2f}x")
    print(f"sim idle CPU over 2 s after the run: {sim['idle_cpu'] * 1e3:.0f} ms")
    print(
        f"sim decode steps: {sim['steps']:.0f}, {sim['steps'] / sim['wall']:.0f} steps/s with "
        f"{args.streams} running; streams finished {sim['finished']:.0f}, lost/short "
        f"{sim['lost']:.0f}"
    )


if __name__ == "__main__":
    main()
