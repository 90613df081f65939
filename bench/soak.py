"""Soak: the router at steady load for minutes with a share of hostile requests; its RSS and p99.

    .venv/bin/python bench/soak.py [--duration 180] [--warmup 30] [--concurrency 8]
        [--hostile 0.1] [--engines 2] [--out bench/results/soak.json] [--plot docs/img/soak.png]

A `kvroute router` process links ``--engines`` simulated engine processes over ipc (a temporary
directory). ``--concurrency`` client loops (one asyncio process, httpx) each send a request as
soon as the last one ended: chat and completions, streamed or not, prompts drawn from a small
pool (so prefix hits happen) with a per-request random tail. A ``--hostile`` share of them is one
of the attacks the router must shrug off: stop strings past the byte limit, top_logprobs and n
past their bounds, JSON nested 1000 deep, an unfit x-request-id, a body over the limit, a
client that leaves after the first event, a request for an unknown model. Every
``--sample`` seconds the router's RSS (psutil) and the window's latency percentiles of the
well-formed requests (arrival to last byte) are recorded.

The verdict is on memory only: after ``--warmup`` seconds the RSS may grow by at most
``--max-growth`` MiB (a leak grows with the requests served; a steady heap plateaus). Exit 1 if
it grew more, if a well-formed request failed, or if a hostile one was not refused as expected.
The latency columns are what they were on this machine at that load (``uptime`` is recorded):
a picture over time, not a figure to compare across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
MODEL = "Qwen/Qwen3-0.6B"
MAX_BODY = 65536  # the router's --max-body-bytes here: an oversized body stays small to send
PROMPTS = [f"You are assistant number {i}. " + "Answer briefly and in plain words. " * 20
           for i in range(8)]


@dataclass
class Window:
    latencies: list[float] = field(default_factory=list)
    good: int = 0
    hostile: int = 0
    failures: list[str] = field(default_factory=list)


def _good(rng: random.Random) -> tuple[str, dict[str, Any], dict[str, str]]:
    tail = f" question {rng.randrange(10**6)}?"
    stream = rng.random() < 0.7
    if rng.random() < 0.5:
        body: dict[str, Any] = {"model": MODEL, "max_tokens": rng.randint(8, 48),
                                "messages": [{"role": "user", "content": rng.choice(PROMPTS)
                                              + tail}]}
        path = "/v1/chat/completions"
    else:
        body = {"model": MODEL, "prompt": rng.choice(PROMPTS) + tail,
                "max_tokens": rng.randint(8, 48)}
        path = "/v1/completions"
    if stream:
        body["stream"] = True
    return path, body, {}


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


# (name, path, body, headers, expected status); "leave" is answered 200 and abandoned.
def _hostile(rng: random.Random) -> tuple[str, str, Any, dict[str, str], int]:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    kind = rng.choice(["stop", "top_logprobs", "n", "nested", "request_id", "too_big", "leave",
                       "model"])
    if kind == "stop":
        return kind, "/v1/chat/completions", {**chat, "stop": ["x" * 20_000]}, {}, 400
    if kind == "top_logprobs":
        return kind, "/v1/chat/completions", {**chat, "logprobs": True,
                                              "top_logprobs": 1_000_000}, {}, 400
    if kind == "n":
        return kind, "/v1/chat/completions", {**chat, "n": 100_000}, {}, 400
    if kind == "nested":
        return kind, "/v1/chat/completions", {**chat,
                                              "chat_template_kwargs": _nested(500)}, {}, 400
    if kind == "request_id":
        return kind, "/v1/chat/completions", chat, {"x-request-id": "r" * 4000}, 400
    if kind == "too_big":
        return kind, "/v1/completions", {"model": MODEL, "prompt": "y" * 2 * MAX_BODY}, {}, 413
    if kind == "model":
        return kind, "/v1/chat/completions", {**chat, "model": "nope"}, {}, 404
    return kind, "/v1/chat/completions", {**chat, "max_tokens": 400, "stream": True}, {}, 200


async def _one_good(http: httpx.AsyncClient, rng: random.Random, win: Window) -> None:
    path, body, headers = _good(rng)
    t0 = time.perf_counter()
    what = ""
    try:
        if body.get("stream"):
            async with http.stream("POST", path, json=body, headers=headers) as r:
                last = ""
                async for line in r.aiter_lines():
                    if line:
                        last = line
                ok = r.status_code == 200 and last == "data: [DONE]"
                what = f"{r.status_code} {last[:200]}"
        else:
            r = await http.post(path, json=body, headers=headers)
            ok = r.status_code == 200 and "choices" in r.json()
            what = f"{r.status_code} {r.text[:200]}"
    except httpx.HTTPError as exc:
        ok, what = False, repr(exc)
    if ok:
        win.latencies.append(time.perf_counter() - t0)
        win.good += 1
    else:
        win.failures.append(f"{path}: {what}")


async def _one_hostile(http: httpx.AsyncClient, rng: random.Random, win: Window,
                       kinds: Counter[str]) -> None:
    kind, path, body, headers, expect = _hostile(rng)
    kinds[kind] += 1
    win.hostile += 1
    try:
        content = json.dumps(body).encode()
        if kind == "leave":
            async with http.stream("POST", path, content=content, headers={
                    "content-type": "application/json"}) as r:
                async for _ in r.aiter_lines():
                    break  # the client leaves after its first event
            status = r.status_code
        else:
            r = await http.post(path, content=content,
                                headers={"content-type": "application/json", **headers})
            status = r.status_code
    except httpx.HTTPError as exc:
        win.failures.append(f"hostile {kind}: {exc!r}")
        return
    if status != expect:
        win.failures.append(f"hostile {kind}: {status}, expected {expect}")


async def _client(url: str, seed: int, hostile: float, deadline: float, windows: list[Window],
                  kinds: Counter[str]) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        while time.monotonic() < deadline:
            win = windows[-1]
            if rng.random() < hostile:
                await _one_hostile(http, rng, win, kinds)
            else:
                await _one_good(http, rng, win)


def _ms(xs: list[float], q: float) -> float | None:
    """The ``q`` quantile of ``xs`` (seconds) in ms; None for an empty window."""
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3


async def _soak(url: str, router: psutil.Process, a: argparse.Namespace
                ) -> tuple[list[dict[str, Any]], Counter[str], list[str]]:
    start = time.monotonic()
    deadline = start + a.duration
    windows = [Window()]
    kinds: Counter[str] = Counter()
    clients = [asyncio.create_task(_client(url, i, a.hostile, deadline, windows, kinds))
               for i in range(a.concurrency)]
    samples: list[dict[str, Any]] = []
    failures: list[str] = []
    while time.monotonic() < deadline:
        await asyncio.sleep(a.sample)  # a sampling period, not a synchronisation
        win = windows[-1]
        windows.append(Window())  # requests starting from now on are counted in the next one
        lat = win.latencies
        samples.append({
            "t": round(time.monotonic() - start, 1),
            "rss_mib": router.memory_info().rss / 2**20,
            "p50_ms": _ms(lat, 0.5), "p99_ms": _ms(lat, 0.99),
            "good": win.good, "hostile": win.hostile, "failures": len(win.failures),
        })
        failures += win.failures
        s = samples[-1]
        print(f"t={s['t']:6.1f}s rss={s['rss_mib']:7.1f} MiB p50={s['p50_ms'] or 0:7.1f} ms "
              f"p99={s['p99_ms'] or 0:7.1f} ms good={s['good']} hostile={s['hostile']} "
              f"failed={s['failures']}", flush=True)
    await asyncio.gather(*clients)
    failures += windows[-1].failures
    return samples, kinds, failures


def _start(tmp: Path, engines: int) -> tuple[subprocess.Popen[bytes], list[subprocess.Popen[bytes]],
                                              str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1",
               TOKENIZERS_PARALLELISM="false")
    cli = [sys.executable, "-m", "kvroute.cli"]
    args = ["router", "--port", "0", "--plain-logs", "--log-level", "ERROR",
            "--state-dir", str(tmp / "state"), "--max-model-len", "4096",
            "--max-body-bytes", str(MAX_BODY)]
    names = [f"e{i}" for i in range(engines)]
    for n in names:
        args += ["--engine", f"{n}=ipc://{tmp}/{n}.hs"]
    router = subprocess.Popen([*cli, *args], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
    assert router.stdout is not None
    url = ""
    for raw in router.stdout:
        m = re.search(r"serving \S+ on (http://\S+) ", raw.decode(errors="replace"))
        if m:
            url = m.group(1)
            break
    if not url:
        raise RuntimeError(f"the router exited ({router.wait()})")
    sims = []
    for n in names:
        kv = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"ipc://{tmp}/{n}.kv", "replay_endpoint": f"ipc://{tmp}/{n}.replay"}
        sims.append(subprocess.Popen([*cli, "sim-engine", "--handshake-address",
                                      f"ipc://{tmp}/{n}.hs", "--step-time", "0.005",
                                      "--kv-events-config", json.dumps(kv)], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    deadline = time.monotonic() + 120
    while httpx.get(f"{url}/ready").status_code != 200:
        if time.monotonic() > deadline:
            raise RuntimeError("no engine ready in 120 s")
        time.sleep(0.2)  # polling another process's readiness, not synchronising
    # The router's output must keep draining (a full pipe would block its logging).
    threading.Thread(target=lambda: router.stdout.read() if router.stdout else None,
                     daemon=True).start()
    return router, sims, url


def _plot(result: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["samples"]
    t = [x["t"] for x in s]
    fig, (mem, lat) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    rss = [x["rss_mib"] for x in s]
    mem.plot(t, rss, color="tab:blue")
    mem.axvline(result["warmup_s"], color="grey", linestyle="--", linewidth=1)
    mem.set_ylim(0, max(rss) * 1.15)  # from zero: a flat line reads flat
    growth = result["rss_after_warmup_mib"]["growth"]
    mem.text(0.99, 0.05, f"growth after warm-up: {growth:.1f} MiB", ha="right",
             transform=mem.transAxes)
    mem.set_ylabel("router RSS (MiB)")
    mem.set_title(f"soak: {result['concurrency']} clients, {result['hostile_share']:.0%} hostile, "
                  f"{result['engines']} sim engines (load {result['load_avg']})")
    lat.plot(t, [x["p99_ms"] for x in s], label="p99", color="tab:red")
    lat.plot(t, [x["p50_ms"] for x in s], label="p50", color="tab:green")
    lat.axvline(result["warmup_s"], color="grey", linestyle="--", linewidth=1)
    lat.set_ylabel("well-formed request latency (ms)")
    lat.set_xlabel("seconds")
    lat.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--duration", type=float, default=180.0)
    p.add_argument("--warmup", type=float, default=30.0)
    p.add_argument("--sample", type=float, default=5.0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--hostile", type=float, default=0.1, help="share of hostile requests")
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--max-growth", type=float, default=32.0,
                   help="MiB the router's RSS may grow after the warm-up")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "soak.json")
    p.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "soak.png")
    p.add_argument("--replot", action="store_true", help="only plot --out's result again")
    a = p.parse_args()
    if a.replot:
        _plot(json.loads(a.out.read_text()), a.plot)
        return 0
    with tempfile.TemporaryDirectory(prefix="kvroute-soak-") as tmp:
        router, sims, url = _start(Path(tmp), a.engines)
        try:
            samples, kinds, failures = asyncio.run(_soak(url, psutil.Process(router.pid), a))
        finally:
            router.send_signal(signal.SIGTERM)
            router.wait(60)
            for sim in sims:
                sim.send_signal(signal.SIGTERM)
                sim.wait(30)
    after = [x["rss_mib"] for x in samples if x["t"] >= a.warmup]
    growth = (max(after) - after[0]) if after else 0.0
    result = {
        "duration_s": a.duration, "warmup_s": a.warmup, "concurrency": a.concurrency,
        "hostile_share": a.hostile, "engines": a.engines,
        "load_avg": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "rss_after_warmup_mib": {"first": after[0] if after else None,
                                 "max": max(after) if after else None, "growth": growth},
        "hostile_kinds": dict(kinds), "failures": failures[:50], "samples": samples,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1))
    _plot(result, a.plot)
    good = sum(x["good"] for x in samples)
    print(f"served {good} well-formed and {sum(kinds.values())} hostile requests "
          f"({dict(kinds)}); RSS after warm-up {after[0] if after else 0:.1f} -> "
          f"max {max(after) if after else 0:.1f} MiB (growth {growth:.1f} MiB, allowed "
          f"{a.max_growth:g}); {len(failures)} failures; load {result['load_avg']}")
    for f in failures[:10]:
        print("  failure:", f)
    return 0 if growth <= a.max_growth and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
