"""bench/compare.py's load: a raw asyncio HTTP/1.1 client replaying a schedule, in its own process.

Each request is sent at its time in the schedule (open loop: a slow router does not slow the
sender) on an idle keep-alive connection, or a new one. A streamed answer is read chunk by chunk:
TTFT is the time to the first chunk carrying generated text (a chat delta with non-empty
``content``; the role-only first event some servers send before any token does not count),
latency the time to the stream's end. An HTTP
client library would spend about a millisecond of CPU per request here, on the same two cores
as the routers under test (see bench/httpload.py).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

PROGRESS_EVERY = 1.0
REQUEST_TIMEOUT = 120.0


@dataclass
class Result:
    at: float  # scheduled send time (s from the start)
    late: float  # how far behind schedule it was sent
    ttft: float
    latency: float
    status: int
    error: str | None = None
    route: str = ""  # kvroute's x-kvroute-route header (engine, cached, reason), if any
    cached: int = -1  # the engine's usage.prompt_tokens_details.cached_tokens (-1: not reported)


class _Pool:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def get(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while self.idle:
            reader, writer = self.idle.pop()
            if not writer.is_closing() and not reader.at_eof():
                return reader, writer
        return await asyncio.open_connection(self.host, self.port)

    def put(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.idle.append(conn)

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()


_CACHED = re.compile(rb'"cached_tokens": ?(\d+)')


def _has_token(chunk: bytes) -> bool:
    """A chat delta with text in it (``"content":"x``), as any of the servers writes it."""
    for marker in (b'"content":"', b'"content": "'):
        i = chunk.find(marker)
        while i >= 0:
            if chunk[i + len(marker):i + len(marker) + 1] != b'"':
                return True
            i = chunk.find(marker, i + 1)
    return False


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes,
                    t0: float) -> tuple[int, float, bool, bytes, str, int]:
    """Send one request; (status, ttft, keep-alive, error body, route header, cached tokens)."""
    writer.write(payload)
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length, chunked, keep, route = None, False, True, ""
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        key, value = name.strip().lower(), value.strip().lower()
        if key == b"content-length":
            length = int(value)
        elif key == b"transfer-encoding" and b"chunked" in value:
            chunked = True
        elif key == b"connection" and value == b"close":
            keep = False
        elif key == b"x-kvroute-route":
            route = line.partition(b":")[2].strip().decode()
    ttft = float("nan")
    body = b""
    cached = -1
    if chunked:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            chunk = await reader.readexactly(size + 2)
            if ttft != ttft and _has_token(chunk):
                ttft = time.perf_counter() - t0
            if (m := _CACHED.search(chunk)) is not None:
                cached = int(m[1])
            if status >= 300 and len(body) < 2000:
                body += chunk
    elif length is not None:
        body = await reader.readexactly(length)
        if _has_token(body):
            ttft = time.perf_counter() - t0
    else:  # no length: the body runs to the connection's end
        body = await reader.read()
        keep = False
        if _has_token(body):
            ttft = time.perf_counter() - t0
    if (m := _CACHED.search(body)) is not None:
        cached = int(m[1])
    return status, ttft, keep, body, route, cached


async def replay(host: str, port: int, schedule: list[tuple[float, bytes]],
                 path: str = "/v1/chat/completions",
                 progress: Callable[[int, int], None] | None = None) -> list[Result]:
    """Send every body at its time; the results in schedule order."""
    pool = _Pool(host, port)
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            "Accept: text/event-stream\r\nConnection: keep-alive\r\n")
    results: list[Result | None] = [None] * len(schedule)
    done = [0, 0]
    start = time.perf_counter()

    async def one(i: int, at: float, body: bytes) -> None:
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        t0 = time.perf_counter()
        payload = f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
        try:
            conn = await pool.get()
            status, ttft, keep, err, route, cached = await asyncio.wait_for(
                _exchange(*conn, payload, t0), REQUEST_TIMEOUT)
            if keep:
                pool.put(conn)
            else:
                conn[1].close()
            error = None if status == 200 else err[:300].decode(errors="replace")
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                TimeoutError, ValueError, IndexError) as exc:
            status, ttft, error, route, cached = 0, float("nan"), repr(exc), "", -1
        results[i] = Result(at, t0 - start - at, ttft, time.perf_counter() - t0, status, error,
                            route, cached)
        done[0] += 1
        done[1] += error is not None

    async def report() -> None:
        while True:
            await asyncio.sleep(PROGRESS_EVERY)
            if progress is not None:
                progress(done[0], done[1])

    reporter = asyncio.create_task(report())
    try:
        await asyncio.gather(*(one(i, at, body) for i, (at, body) in enumerate(schedule)))
    finally:
        reporter.cancel()
        pool.close()
    return [r for r in results if r is not None]


def _child(conn: object, host: str, port: int, schedule: list[tuple[float, bytes]]) -> None:
    import uvloop

    def progress(done: int, errors: int) -> None:
        conn.send(("progress", done, errors))  # type: ignore[attr-defined]

    try:
        results = uvloop.run(replay(host, port, schedule, progress=progress))
        conn.send(("done", results))  # type: ignore[attr-defined]
    except BaseException as exc:  # reported to the parent rather than hanging it
        conn.send(("error", repr(exc)))  # type: ignore[attr-defined]


def run_in_process(host: str, port: int, schedule: list[tuple[float, bytes]],
                   on_progress: Callable[[int, int], None],
                   timeout: float) -> list[Result]:
    """Replay ``schedule`` from a fresh process (no GIL shared with the harness)."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child, host, port, schedule), daemon=True)
    proc.start()
    deadline = time.monotonic() + timeout
    try:
        while True:
            if not parent.poll(0.5):
                if not proc.is_alive():
                    raise RuntimeError(f"load process exited with {proc.exitcode}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"load did not finish within {timeout:.0f} s")
                continue
            msg = parent.recv()
            if msg[0] == "progress":
                on_progress(msg[1], msg[2])
            elif msg[0] == "done":
                return list(msg[1])
            else:
                raise RuntimeError(f"load process failed: {msg[1]}")
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
