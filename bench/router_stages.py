"""Where a token-in request's added latency goes in the router: stage times on the critical path.

    .venv/bin/python bench/router_stages.py [--requests 1200] [--http-server hypercorn]

A `kvroute router` runs from this file (``--serve``), with timestamps (``time.perf_counter``, one
clock for every process here) taken at stage boundaries by wrappers around the functions named
below; its sim engine has zero engine time. The bench process sends token-in requests
(256 random ids, max_tokens=1) one at a time, each followed by the same ids sent straight to an
identical sim engine through an EngineClient (the direct path, as bench/router.py (b)). It
prints the p50 of each stage over the requests after ``--warmup``.

The wrappers add a Python call and a clock read or two each, so the stages are slightly
inflated; their p50s should add up to about the router's p50, and the engine round trip from the
router should equal the direct one (a larger one means the router waits there). A diagnostic,
not a benchmark of record: the target's measure is bench/router.py (b).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

# (stage name, from mark, to mark), in the order a request passes them.
STAGES = (
    ("client write -> router reads", "client", "in"),
    ("HTTP parse, stream, app task (Hypercorn)", "in", "app"),
    ("app -> handler (fast path, body)", "app", "opener"),
    ("decode, checks, spec, admission", "opener", "decide"),
    ("routing decision (radix match, policy)", "decide", "decided"),
    ("ADD encode + ZMQ send", "decided", "sent"),
    ("engine round trip", "sent", "output"),
    ("output decode -> response object", "output", "respond"),
    ("collect, JSON, HTTP write", "respond", "write"),
    ("router write -> client has it", "write", "done"),
)


def _serve(argv: list[str]) -> int:
    """The router, with stage marks; SIGUSR1 writes them to $STAGES_OUT and exits."""
    import hypercorn.asyncio.tcp_server as tcp_server
    import hypercorn.protocol.h11 as h11_protocol
    from hypercorn.events import RawData

    import router.front.app as app
    import router.front.fast_path as fast_path
    import router.front.respond as respond
    import router.link.engine_client as engine_client
    import router.routing.policy as policy
    from kvroute.cli import main

    marks: list[tuple[str, float]] = []
    now = time.perf_counter

    def mark_async(cls: Any, name: str, tag: str, after: bool = False,
                   when: Callable[..., bool] = lambda *a: True) -> None:
        inner = getattr(cls, name)

        async def wrapped(*a: Any, **k: Any) -> Any:
            if not after and when(*a):
                marks.append((tag, now()))
            result = await inner(*a, **k)
            if after:
                marks.append((tag, now()))
            return result
        setattr(cls, name, wrapped)

    def mark_sync(cls: Any, name: str, tag: str, end_tag: str | None = None) -> None:
        inner = getattr(cls, name)

        def wrapped(*a: Any, **k: Any) -> Any:
            marks.append((tag, now()))
            result = inner(*a, **k)
            if end_tag:
                marks.append((end_tag, now()))
            return result
        setattr(cls, name, wrapped)

    mark_async(h11_protocol.H11Protocol, "handle", "in",
               when=lambda _self, event: isinstance(event, RawData))
    # A request's first write is its mark (later ones are ignored).
    mark_async(tcp_server.TCPServer, "protocol_send", "write",
               when=lambda _self, event: isinstance(event, RawData) and bool(event.data))
    mark_async(app.RouterApp, "__call__", "app")
    mark_sync(policy.Policy, "decide", "decide", "decided")
    mark_async(engine_client.EngineClient, "_send", "sent", after=True)
    mark_sync(engine_client.EngineClient, "on_output_frames", "output")
    mark_async(respond.EngineResponse, "__call__", "respond")
    opener = fast_path.OPENERS["/inference/v1/generate"]

    async def opened(*a: Any, **k: Any) -> Any:
        marks.append(("opener", now()))
        return await opener(*a, **k)
    fast_path.OPENERS = {**fast_path.OPENERS, "/inference/v1/generate": opened}

    def dump(*_: Any) -> None:
        Path(os.environ["STAGES_OUT"]).write_text(json.dumps(marks))
        os._exit(0)
    signal.signal(signal.SIGUSR1, dump)
    return main(argv)


async def _run(n: int, warmup: int, server: str) -> None:
    import msgspec

    from bench.httpload import build_request, read_response
    from bench.router import PY, spawn_engine, start_router_flags
    from router.config import EngineSpec
    from router.link.engine_client import EngineClient
    from wire.engine import EngineCoreRequest
    from wire.sampling import SamplingParams

    tmp = Path(tempfile.mkdtemp(prefix="kvr-stages-"))
    zero = ("--step-time", "0", "--prefill-time-per-token", "0")
    engines = [spawn_engine(tmp, name, *zero) for name in ("d", "r")]
    out = tmp / "marks.json"
    # Returns once /ready answers: listening, with its engine connected.
    router, port = start_router_flags(
        ["--http-server", server, "--engine", f"r=ipc://{tmp}/r.hs"],
        launcher=[PY, __file__, "--serve"], env={**os.environ, "STAGES_OUT": str(out)})
    client = EngineClient([EngineSpec("d", f"ipc://{tmp}/d.hs")])
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await client.start()
        await client.wait_ready(60)
        rng = random.Random(0)
        sent: list[tuple[float, float]] = []
        direct: list[float] = []
        for i in range(warmup + n):
            ids = [rng.randrange(1000, 100000) for _ in range(256)]
            body = msgspec.json.encode({"request_id": f"s-{i}", "token_ids": ids,
                                        "sampling_params": {"max_tokens": 1,
                                                            "temperature": 0.0}})
            request = build_request("127.0.0.1", port, "POST", "/inference/v1/generate", body)
            t0 = time.perf_counter()
            writer.write(request)
            status, data = await read_response(reader)
            sent.append((t0, time.perf_counter()))
            assert status == 200, data[:300]
            t0 = time.perf_counter()
            stream = await client.submit("d", EngineCoreRequest(
                f"d-{i}", ids, None, SamplingParams(max_tokens=1, temperature=0.0), None,
                time.time(), None, None, None))
            await stream.collect()
            direct.append(time.perf_counter() - t0)
        writer.close()
        router.send_signal(signal.SIGUSR1)
        router.wait(30)
        marks = json.loads(out.read_text())
    finally:
        await client.close()
        if router.poll() is None:
            router.terminate()
            router.wait(30)
        for e in engines:
            e.terminate()
            e.wait(30)
    # One request's marks run from its "in" to its last "write"; requests are sequential.
    requests: list[dict[str, float]] = []
    for tag, t in marks:
        if tag == "in" and (not requests or "write" in requests[-1]):
            requests.append({})
        if requests:
            requests[-1].setdefault(tag, t)
    requests = requests[-len(sent):]  # before them: the readiness polls
    rows = []
    for (t0, t1), req in list(zip(sent, requests, strict=True))[warmup:]:
        rows.append({**req, "client": t0, "done": t1})
    print(f"{server}: {n} token-in requests (256 ids, max_tokens=1), p50 per stage, us")
    total = 0.0
    for name, a, b in STAGES:
        p50 = statistics.median(r[b] - r[a] for r in rows) * 1e6
        total += p50
        print(f"  {name:42s} {p50:8.0f}")
    print(f"  {'sum of stage p50s':42s} {total:8.0f}")
    print(f"  {'router path p50 (client)':42s} "
          f"{statistics.median(r['done'] - r['client'] for r in rows) * 1e6:8.0f}")
    print(f"  {'direct path p50':42s} {statistics.median(direct[warmup:]) * 1e6:8.0f}")


def main() -> int:
    if sys.argv[1:2] == ["--serve"]:
        return _serve(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=1200)
    p.add_argument("--warmup", type=int, default=200)
    # The stage marks wrap Hypercorn's protocol classes: the other servers have no such hooks.
    p.add_argument("--http-server", default="hypercorn", choices=("hypercorn",))
    a = p.parse_args()
    asyncio.run(_run(a.requests, a.warmup, a.http_server))
    return 0


if __name__ == "__main__":
    sys.exit(main())
