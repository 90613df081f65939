"""/health while 100k-token chats render: helper process vs the in-process thread path, same run.

    .venv/bin/python bench/render_offload.py [--rounds 4] [--probes 300] [--servers helper,thread]

The /health-under-load procedure (its bound checked by bench/render_health.py)
on each server kind, rounds interleaved: fresh ~400 KB chats (102k tokens each, none from the
segment cache) sent one after another by another process (tests/chat_sender.py) while this one
probes /health back to back on its own keep-alive connection; between renders, the same probes
while the sender builds its next chat (control: another process busy on a core, nothing
rendering) and 30 with nothing running (idle). Kinds: helper (`kvroute render`, default:
--render-processes 1), thread (--render-processes 0), ping (the helper server, the same bodies
POSTed to /ping: the HTTP server reading 400 KB with no render at all, the floor under the
others), uvicorn (helper on --http-server uvicorn), and helper-hypercorn / ping-hypercorn (the
same on --http-server hypercorn). Per kind: medians over the rounds of each
round's p50 / p99 / max.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.render_proc import render_process  # noqa: E402

MODEL = "qwen3-long"
KINDS = {
    "helper": (),
    "thread": ("--render-processes", "0"),
    "ping": (),
    "uvicorn": ("--http-server", "uvicorn"),
    "helper-hypercorn": ("--http-server", "hypercorn"),
    "ping-hypercorn": ("--http-server", "hypercorn"),
}
HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


def long_model(tmp: Path) -> Path:
    """The embedded Qwen3 tokenizer with a 128k context (YaRN), for 100k-token chats."""
    for f in (ROOT / "render/models/qwen3").iterdir():
        if f.name != "config.json":
            (tmp / f.name).symlink_to(f)
    config = json.loads((ROOT / "render/models/qwen3/config.json").read_text())
    config["max_position_embeddings"] = 131072
    (tmp / "config.json").write_text(json.dumps(config))
    return tmp


async def roundtrip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    request: bytes) -> bytes:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    m = re.search(rb"(?i)content-length:\s*(\d+)", head)
    return await reader.readexactly(int(m.group(1))) if m else b""


async def measure(url: str, kind: str, probes: int) -> dict[str, float]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    if kind != "thread":  # until the helper has loaded, big bodies render on a thread
        while True:
            text = (await roundtrip(reader, writer, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"))
            if re.search(rb"^kvroute_render_helpers_ready\{[^}]*\} 1\.0$", text, re.M):
                break
    path = "/ping" if kind.startswith("ping") else "/v1/chat/completions/render"
    sender = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.chat_sender", host, port, MODEL, "7", path, cwd=ROOT,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert sender.stdin is not None and sender.stdout is not None

    async def probe() -> float:
        t0 = time.perf_counter()
        await roundtrip(reader, writer, HEALTH)
        return time.perf_counter() - t0

    async def probe_until(text: bytes) -> list[float]:
        assert sender.stdout is not None
        probes = []
        arrived = asyncio.create_task(sender.stdout.readline())
        while not arrived.done():
            probes.append(await probe())
        line = (await arrived).strip()
        assert line == text, (kind, line)
        return probes

    idle: list[float] = []
    control: list[float] = []
    busy: list[float] = []
    renders = 0
    render_s = 0.0
    while renders < 60 and len(busy) < probes:
        assert (await sender.stdout.readline()).strip() == b"building"
        control += await probe_until(b"ready")  # the sender busy on a core, no render
        idle += [await probe() for _ in range(30)]
        t0 = time.perf_counter()
        sender.stdin.write(b"go\n")
        busy += await probe_until(b"done 200")
        render_s += time.perf_counter() - t0
        await sender.stdout.readline()  # tokens N
        renders += 1
    sender.stdin.close()
    await sender.wait()
    writer.close()
    busy.sort()
    return {
        "renders": renders, "ms/render": render_s / renders * 1e3, "n": len(busy),
        "p50": busy[len(busy) // 2] * 1e3, "p99": busy[int(0.99 * len(busy))] * 1e3,
        "max": busy[-1] * 1e3, "idle p99": sorted(idle)[int(0.99 * len(idle))] * 1e3,
        "control p99": sorted(control)[int(0.99 * len(control))] * 1e3,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--probes", type=int, default=300, help="busy probes per round and kind")
    p.add_argument("--servers", default="helper,thread,ping",
                   help=f"comma-separated kinds out of {','.join(KINDS)}")
    a = p.parse_args()
    kinds = a.servers.split(",")
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        model = long_model(Path(tmp))
        for r in range(a.rounds):
            for kind in kinds:
                with render_process("--model", str(model), "--served-model-name", MODEL,
                                    *KINDS[kind], timeout=180) as (url, _):
                    row = asyncio.run(measure(url, kind, a.probes))
                rows[kind].append(row)
                print(f"round {r} {kind:8s} " + " ".join(
                    f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in row.items()), flush=True)
    cols = ["ms/render", "n", "p50", "p99", "max", "idle p99", "control p99"]
    print(f"\nmedians over {a.rounds} rounds (ms)\n")
    print("| server | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for kind in kinds:
        med = {c: statistics.median(row[c] for row in rows[kind]) for c in cols}
        print(f"| {kind} | " + " | ".join(f"{med[c]:.2f}" for c in cols) + " |")
    if "helper" in rows and "thread" in rows:
        for c in ("p99", "max"):
            ratios = [h[c] / t[c] for h, t in zip(rows["helper"], rows["thread"], strict=True)]
            print(f"\nhelper / thread {c} per round: " + ", ".join(f"{x:.2f}" for x in ratios))


if __name__ == "__main__":
    main()
