"""A raw asyncio HTTP/1.1 keep-alive load generator in its own process.

An HTTP client library's own per-request CPU would be part of every latency measured (and take
CPU from the server under test), so this writes the requests and finds the answers' ends itself.

Usage from code::

    stats = run_in_process("127.0.0.1", 8000, bodies, concurrency=8, path="/tokenize",
                           requests=1000)

Each of ``concurrency`` connections sends its next request as soon as the previous response is
complete (closed loop). Bodies are taken round-robin from the shared list, so with as many bodies as
requests every request is unique. Responses are parsed just enough to find their end
(Content-Length or chunked); a non-2xx status is counted as an error, never silently accepted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import sys
import time
from dataclasses import dataclass, field


@dataclass
class LoadStats:
    """What one load run measured; latencies in seconds."""

    sent: int = 0
    errors: int = 0
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    first_error: str | None = None

    @property
    def rps(self) -> float:
        return (self.sent - self.errors) / self.elapsed if self.elapsed > 0 else 0.0

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    def summary(self) -> dict[str, float]:
        return {
            "sent": self.sent,
            "errors": self.errors,
            "rps": self.rps,
            "p50_ms": self.pct(0.50) * 1e3,
            "p99_ms": self.pct(0.99) * 1e3,
            "mean_ms": (statistics.fmean(self.latencies) * 1e3) if self.latencies else float("nan"),
        }


def build_request(host: str, port: int, method: str, path: str, body: bytes) -> bytes:
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: keep-alive\r\n\r\n"
    )
    return head.encode("ascii") + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """Reads one HTTP/1.1 response; returns (status, body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length: int | None = None
    chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        key = name.strip().lower()
        if key == b"content-length":
            length = int(value.strip())
        elif key == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:
        parts: list[bytes] = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # trailer end (no trailers expected)
                return status, b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
    return status, (await reader.readexactly(length) if length else b"")


async def _worker(
    host: str, port: int, payloads: list[bytes], counter: list[int], deadline: float,
    total: int, stats: LoadStats,
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while True:
            i = counter[0]
            if i >= total or time.perf_counter() >= deadline:
                return
            counter[0] = i + 1
            t0 = time.perf_counter()
            writer.write(payloads[i % len(payloads)])
            status, body = await read_response(reader)
            stats.latencies.append(time.perf_counter() - t0)
            stats.sent += 1
            stats.statuses[status] = stats.statuses.get(status, 0) + 1
            if not 200 <= status < 300:
                stats.errors += 1
                if stats.first_error is None:
                    stats.first_error = f"{status}: {body[:300]!r}"
    finally:
        writer.close()


async def run_load(
    host: str, port: int, bodies: list[bytes], *, concurrency: int, path: str,
    requests: int, max_seconds: float = 60.0, method: str = "POST",
) -> LoadStats:
    """Sends ``requests`` requests over ``concurrency`` keep-alive connections (max_seconds cap)."""
    payloads = [build_request(host, port, method, path, b) for b in bodies]
    stats = LoadStats()
    counter = [0]
    t0 = time.perf_counter()
    deadline = t0 + max_seconds
    await asyncio.gather(*(
        _worker(host, port, payloads, counter, deadline, requests, stats)
        for _ in range(concurrency)
    ))
    stats.elapsed = time.perf_counter() - t0
    return stats


def _child(conn: object, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
    try:
        import uvloop

        stats = uvloop.run(run_load(*args, **kwargs))  # type: ignore[arg-type]
        conn.send(stats)  # type: ignore[attr-defined]
    except BaseException as e:  # report any failure to the parent rather than hang it
        conn.send(e)  # type: ignore[attr-defined]


def run_in_process(
    host: str, port: int, bodies: list[bytes], *, concurrency: int, path: str,
    requests: int, max_seconds: float = 60.0, cpus: set[int] | None = None,
) -> LoadStats:
    """Runs the load in a fresh process (optionally pinned to ``cpus``) so it never shares a GIL."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child, (host, port, bodies), dict(
        concurrency=concurrency, path=path, requests=requests, max_seconds=max_seconds)))
    proc.start()
    if cpus is not None and proc.pid is not None:
        import os

        os.sched_setaffinity(proc.pid, cpus)
    # The child may die before reporting (e.g. it cannot import __main__): never wait forever.
    while not parent.poll(1.0):
        if not proc.is_alive():
            raise RuntimeError(f"load process exited with {proc.exitcode} before reporting")
    result = parent.recv()
    proc.join()
    if isinstance(result, BaseException):
        raise result
    assert isinstance(result, LoadStats)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url", help="e.g. http://127.0.0.1:8000/v1/chat/completions/render")
    p.add_argument("--body-file", required=True, help="JSON lines, one request body per line")
    p.add_argument("-c", "--concurrency", type=int, default=8)
    p.add_argument("-n", "--requests", type=int, default=1000)
    a = p.parse_args(argv)
    rest = a.url.split("://", 1)[1]
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.partition(":")
    with open(a.body_file, "rb") as f:
        bodies = [line.rstrip(b"\n") for line in f if line.strip()]
    stats = run_in_process(host, int(port or 80), bodies, concurrency=a.concurrency,
                           path="/" + path, requests=a.requests)
    print(json.dumps(stats.summary()))
    if stats.first_error:
        print("first error:", stats.first_error, file=sys.stderr)
    return 1 if stats.errors else 0


if __name__ == "__main__":
    sys.exit(main())
