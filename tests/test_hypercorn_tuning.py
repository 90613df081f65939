"""render.hypercorn_tuning: compiled h11 parses and writes as h11 does; the lazy keep-alive timer
and the cached Date header keep Hypercorn's behaviour (idle close, shutdown, one date a second)."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import socket
import time
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import h11
import h11_mypyc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from render import hypercorn_tuning
from serving.server import ServeOptions, serve_asgi

# ---- h11 and h11-mypyc: the same events, errors and bytes ---------------------------------------

_token = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_",
                 min_size=1, max_size=12)
_value = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20)


@st.composite
def _request(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from(["GET", "POST", "PUT", "HEAD", "OPTIONS", "DELETE"]))
    target = "/" + draw(st.text(alphabet="abcxyz019/?=&%.-", max_size=20))
    version = draw(st.sampled_from(["1.1", "1.1", "1.1", "1.0"]))
    headers: list[tuple[str, str]] = []
    if draw(st.integers(0, 9)):  # HTTP/1.1 without Host is an error: sometimes leave it out
        headers.append(("Host", draw(_value)))
    headers += draw(st.lists(st.tuples(_token, _value), max_size=4))
    if draw(st.booleans()):
        headers.append(("Expect", "100-continue"))
    if draw(st.booleans()):
        headers.append(("Connection", draw(st.sampled_from(["close", "keep-alive", "Upgrade"]))))
    body = draw(st.binary(max_size=60))
    framing = draw(st.sampled_from(["length", "chunked", "none"]))
    raw_body = b""
    if framing == "length":
        headers.append(("Content-Length", str(len(body))))
        raw_body = body
    elif framing == "chunked":
        headers.append(("Transfer-Encoding", "chunked"))
        cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=3)))
        for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True):
            if b > a:
                ext = draw(st.sampled_from(["", ";name=value"]))
                raw_body += b"%x%s\r\n%s\r\n" % (b - a, ext.encode(), body[a:b])
        raw_body += b"0\r\n"
        raw_body += b"".join(b"%s: %s\r\n" % (n.encode(), v.encode())
                             for n, v in draw(st.lists(st.tuples(_token, _value), max_size=2)))
        raw_body += b"\r\n"
    fold = draw(st.integers(0, 4)) == 0
    if fold:  # an obsolete line fold continues the header before it
        headers.append(("X-Folded", "a"))
    head = f"{method} {target} HTTP/{version}\r\n" + "".join(
        f"{n}:{draw(st.sampled_from(['', ' ', '  ', chr(9)]))}{v}\r\n" for n, v in headers)
    if fold:
        head += draw(st.sampled_from([" b", "\tb c"])) + "\r\n"
    return head.encode() + b"\r\n" + raw_body


@st.composite
def _stream(draw: st.DrawFn) -> list[bytes]:
    data = b"".join(draw(st.lists(_request(), min_size=1, max_size=3)))
    if draw(st.integers(0, 5)) == 0 and data:  # a corrupted byte somewhere
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1:]
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=6))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True) if b > a]


def _shape(ev: Any) -> tuple[Any, ...]:
    name = type(ev).__name__
    if name == "Request":
        return (name, ev.method, ev.target, ev.http_version, list(ev.headers),
                list(ev.headers.raw_items()))
    if name == "Data":
        return (name, bytes(ev.data), ev.chunk_start, ev.chunk_end)
    if name == "EndOfMessage":
        return (name, list(ev.headers))
    return (name,)


def _serve(mod: ModuleType, chunks: list[bytes], status: int, resp_headers: list[tuple[str, str]],
           resp_body: bytes) -> list[tuple[Any, ...]]:
    """What a server Connection of ``mod`` makes of ``chunks``: every event and error, and the
    bytes of the response it sends after each complete request."""
    conn = mod.Connection(mod.SERVER, max_incomplete_event_size=2048)
    out: list[tuple[Any, ...]] = []
    pending = list(chunks) + [b""]  # b"": the client closes
    while True:
        out.append(("100-continue?", conn.they_are_waiting_for_100_continue))
        try:
            ev = conn.next_event()
        except mod.RemoteProtocolError as e:
            out.append(("RemoteProtocolError", str(e), e.error_status_hint))
            return out
        if ev is mod.NEED_DATA:
            if not pending:
                return out
            conn.receive_data(pending.pop(0))
            continue
        if ev is mod.PAUSED or type(ev).__name__ == "EndOfMessage":
            if type(ev).__name__ == "EndOfMessage":
                out.append(_shape(ev))
            if conn.our_state is not mod.SEND_RESPONSE:
                out.append(("paused", str(conn.our_state), str(conn.their_state)))
                return out
            try:
                out.append(("sent", conn.send(mod.Response(status_code=status,
                                                           headers=resp_headers))))
                out.append(("sent", conn.send(mod.Data(data=resp_body))))
                out.append(("sent", conn.send(mod.EndOfMessage())))
                conn.start_next_cycle()
            except mod.LocalProtocolError as e:
                out.append(("LocalProtocolError", str(e)))
                return out
            continue
        out.append(_shape(ev))
        if type(ev).__name__ == "ConnectionClosed":
            return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunks=_stream(), status=st.sampled_from([200, 204, 404, 500]),
       resp_headers=st.lists(st.tuples(_token, _value), max_size=3),
       length=st.sampled_from([None, "match", "wrong"]), resp_body=st.binary(max_size=40))
def test_compiled_h11_matches_h11(chunks: list[bytes], status: int,
                                  resp_headers: list[tuple[str, str]], length: str | None,
                                  resp_body: bytes) -> None:
    if length is not None:
        n = len(resp_body) + (0 if length == "match" else 1)
        resp_headers = [*resp_headers, ("Content-Length", str(n))]
    pure = _serve(h11, chunks, status, resp_headers, resp_body)
    compiled = _serve(h11_mypyc, chunks, status, resp_headers, resp_body)
    assert compiled == pure


# ---- served: idle close, shutdown, Date ---------------------------------------------------------

async def _app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _listen() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


@contextlib.asynccontextmanager
async def _served(app: Any, server: str = "hypercorn") -> AsyncIterator[tuple[str, int]]:
    """``app`` served on a fresh local socket for the block; yields its address."""
    sock, stop = _listen(), asyncio.Event()
    serving = asyncio.create_task(serve_asgi(
        app, sock, ServeOptions(server=server, error_log=False), stop.wait))
    try:
        yield sock.getsockname()
    finally:
        stop.set()
        await asyncio.wait_for(serving, 15)
        sock.close()


async def _get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert await asyncio.wait_for(reader.readexactly(2), 5) == b"ok"
    return head


@pytest.mark.parametrize("server", ["hypercorn", "hypercorn-stock"])
async def test_idle_keep_alive_connection_closes_after_its_timeout(server: str) -> None:
    sock, stop = _listen(), asyncio.Event()
    timeout = 0.5
    opts = ServeOptions(server=server, keep_alive_timeout=timeout, error_log=False)
    serving = asyncio.create_task(serve_asgi(_app, sock, opts, stop.wait))
    try:
        reader, writer = await asyncio.open_connection(*sock.getsockname())
        # Back-to-back requests on one connection (the tuned timer never arms between them).
        for _ in range(20):
            await _get(reader, writer)
        timer, parser, _, group, server_cls = hypercorn_tuning.parts_in_use()
        tuned = timer is hypercorn_tuning.LazyIdleTask
        assert tuned == (server == "hypercorn")
        assert (parser is h11_mypyc) == (server == "hypercorn")
        assert (group is hypercorn_tuning.LeanTaskGroup) == (server == "hypercorn")
        assert (server_cls is hypercorn_tuning.LeanTCPServer) == (server == "hypercorn")
        t0 = time.monotonic()
        assert await asyncio.wait_for(reader.read(), 10) == b""  # the server closed it
        idle = time.monotonic() - t0
        slack = hypercorn_tuning.ARM_DELAY if tuned else 0.0
        assert timeout * 0.9 <= idle <= timeout + slack + 2.0, idle
        writer.close()
    finally:
        stop.set()
        await asyncio.wait_for(serving, 15)
        sock.close()


async def test_shutdown_closes_idle_keep_alive_connections_promptly() -> None:
    sock, stop = _listen(), asyncio.Event()
    # A long keep-alive: only the shutdown can close this connection soon.
    opts = ServeOptions(server="hypercorn", keep_alive_timeout=60, graceful_timeout=30,
                        error_log=False)
    serving = asyncio.create_task(serve_asgi(_app, sock, opts, stop.wait))
    try:
        reader, writer = await asyncio.open_connection(*sock.getsockname())
        await _get(reader, writer)
        t0 = time.monotonic()
        stop.set()
        assert await asyncio.wait_for(reader.read(), 10) == b""
        await asyncio.wait_for(serving, 10)
        assert time.monotonic() - t0 < hypercorn_tuning.ARM_DELAY + 3.0
        writer.close()
    finally:
        stop.set()
        serving.cancel()
        sock.close()


async def test_date_header_is_current_and_advances() -> None:
    sock, stop = _listen(), asyncio.Event()
    serving = asyncio.create_task(
        serve_asgi(_app, sock, ServeOptions(server="hypercorn", error_log=False), stop.wait))
    try:
        reader, writer = await asyncio.open_connection(*sock.getsockname())
        seen: set[str] = set()
        deadline = time.monotonic() + 5
        while len(seen) < 2 and time.monotonic() < deadline:  # until the second turns over
            head = (await _get(reader, writer)).decode()
            dates = [line.split(":", 1)[1].strip() for line in head.split("\r\n")
                     if line.lower().startswith("date:")]
            assert len(dates) == 1, head
            sent = email.utils.parsedate_to_datetime(dates[0]).timestamp()
            assert abs(sent - time.time()) <= 2.0
            seen.add(dates[0])
            await asyncio.sleep(0.05)  # pacing the polls, not synchronising
        assert len(seen) >= 2, seen
        writer.close()
    finally:
        stop.set()
        await asyncio.wait_for(serving, 15)
        sock.close()


class _Group:
    """What LazyIdleTask sees of Hypercorn's per-connection TaskGroup: its asyncio group."""

    def __init__(self, group: asyncio.TaskGroup) -> None:
        self._task_group = group


async def test_lazy_timer_arms_after_its_delay_and_stop_disarms() -> None:
    fired = asyncio.Event()

    async def watch() -> None:
        fired.set()
        await asyncio.Event().wait()  # as Hypercorn's watcher: runs until cancelled

    async with asyncio.TaskGroup() as group:
        timer = hypercorn_tuning.LazyIdleTask(delay=0.05)
        # Restarted again and again (requests back to back): never armed.
        for _ in range(5):
            await timer.restart(_Group(group), watch)
        assert not fired.is_set()
        await asyncio.wait_for(fired.wait(), 5)  # idle: the watcher starts
        await timer.stop()  # and stop() ends it, or the group would never exit
        fired.clear()
        await timer.restart(_Group(group), watch)
        await timer.stop()
    assert not fired.is_set()


async def test_lazy_timer_firing_after_the_connection_ended_is_harmless() -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    calls = 0

    async def watch() -> None:
        nonlocal calls
        calls += 1

    try:
        async with asyncio.TaskGroup() as group:
            timer = hypercorn_tuning.LazyIdleTask(delay=0.01)
            await timer.restart(_Group(group), watch)
        # The group is finished; the timer fires in between (Hypercorn's close awaits before it
        # stops the timer): no error in the loop, no coroutine left unawaited.
        await asyncio.sleep(0.05)  # lets the 10 ms timer fire; not a synchronisation
        await timer.stop()
    finally:
        loop.set_exception_handler(None)
    assert errors == [] and calls == 0


def test_apply_is_reversible() -> None:
    assert hypercorn_tuning.apply(True)
    assert hypercorn_tuning.parts_in_use() == (
        hypercorn_tuning.LazyIdleTask, h11_mypyc, hypercorn_tuning.HeadHoldingH11Protocol,
        hypercorn_tuning.LeanTaskGroup, hypercorn_tuning.LeanTCPServer)
    assert not hypercorn_tuning.apply(False)
    timer, parser, protocol, group, server = hypercorn_tuning.parts_in_use()
    assert timer is not hypercorn_tuning.LazyIdleTask
    assert parser is h11
    assert protocol is hypercorn_tuning.HeadHoldingH11Protocol.__mro__[1]
    assert group is hypercorn_tuning.LeanTaskGroup.__mro__[1]
    assert server is hypercorn_tuning.LeanTCPServer.__mro__[1]


# ---- the app's receive channel: asyncio.Queue's put/get ------------------------------------------

# A script: ("put", value) / ("get", _) start a task; ("cancel", k) cancels the k-th started task
# (mod the count) if it still runs; ("step", _) runs one loop turn (a waiter can be woken and
# then cancelled before it resumes); ("run", _) lets the loop run until nothing is ready.
_op = st.one_of(st.tuples(st.just("put"), st.integers(0, 99)),
                st.tuples(st.just("get"), st.just(0)),
                st.tuples(st.just("cancel"), st.integers(0, 30)),
                st.tuples(st.just("step"), st.just(0)),
                st.tuples(st.just("run"), st.just(0)))


async def _settle() -> None:
    for _ in range(8):  # wake-ups chain through a few loop turns at most
        await asyncio.sleep(0)


async def _play(make: Any, script: list[tuple[str, int]]) -> list[Any]:
    """What each started task ended with (a got value, "put", "cancelled" or "pending"), and
    what is left in the queue, in order."""
    queue = make()
    tasks: list[asyncio.Task[Any]] = []
    for op, arg in script:
        if op == "put":
            tasks.append(asyncio.ensure_future(queue.put(arg)))
        elif op == "get":
            tasks.append(asyncio.ensure_future(queue.get()))
        elif op == "cancel" and tasks:
            tasks[arg % len(tasks)].cancel()
        elif op == "step":
            await asyncio.sleep(0)
        elif op == "run":
            await _settle()
    await _settle()
    ends: list[Any] = []
    for task in tasks:
        if not task.done():
            ends.append("pending")
            task.cancel()
        elif task.cancelled():
            ends.append("cancelled")
        else:
            ends.append("put" if task.result() is None else task.result())
    await _settle()
    left = []
    while queue.qsize():
        left.append(await queue.get())
    return [ends, left]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 3), st.lists(_op, max_size=40))
# A getter, then a putter, woken and cancelled before it resumes: the wake-up must pass on.
@example(0, [("get", 0), ("get", 0), ("run", 0), ("put", 5), ("step", 0), ("cancel", 0),
             ("run", 0)])
@example(1, [("put", 1), ("put", 2), ("put", 3), ("run", 0), ("get", 0), ("step", 0),
             ("cancel", 1), ("run", 0)])
def test_app_channel_behaves_as_asyncio_queue(maxsize: int, script: list[tuple[str, int]]) -> None:
    """Same script, same outcome for every task (values got, puts done, waits, cancellations)
    and the same messages left, in the same order."""
    async def both() -> tuple[list[Any], list[Any]]:
        lean = await _play(lambda: hypercorn_tuning.AppChannel(maxsize), script)
        stdlib = await _play(lambda: asyncio.Queue(maxsize), script)
        return lean, stdlib

    lean, stdlib = asyncio.run(both())
    assert lean == stdlib


async def test_app_channel_bounds_unread_messages() -> None:
    """The server's put waits while the app has ``maxsize`` messages unread (back-pressure on
    a request body the app does not read), and resumes as the app reads."""
    channel = hypercorn_tuning.AppChannel(2)
    await channel.put(1)
    await channel.put(2)
    third = asyncio.ensure_future(channel.put(3))
    await _settle()
    assert not third.done()
    assert await channel.get() == 1
    await asyncio.wait_for(third, 5)
    assert [await channel.get(), await channel.get()] == [2, 3]


async def test_app_reads_a_large_body_through_the_lean_channel() -> None:
    """A body in many chunks (more than ``max_app_queue_size`` puts) reaches the app whole."""
    sizes: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _app(scope, receive, send)
            return
        total = 0
        while True:
            message = await receive()
            total += len(message.get("body", b""))
            await asyncio.sleep(0)  # a slow reader: the channel fills up
            if not message.get("more_body"):
                break
        sizes.append(total)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(str(total))).encode())]})
        await send({"type": "http.response.body", "body": str(total).encode()})

    sock, stop = _listen(), asyncio.Event()
    serving = asyncio.create_task(serve_asgi(
        app, sock, ServeOptions(server="hypercorn", error_log=False), stop.wait))
    try:
        reader, writer = await asyncio.open_connection(*sock.getsockname())
        body = b"x" * (3 << 20)
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body))
        for i in range(0, len(body), 1 << 14):
            writer.write(body[i:i + (1 << 14)])
            await writer.drain()
        raw = await asyncio.wait_for(reader.read(-1), 20)
        assert raw.endswith(str(len(body)).encode()) and sizes == [len(body)]
        assert hypercorn_tuning.parts_in_use()[3] is hypercorn_tuning.LeanTaskGroup
        writer.close()
    finally:
        stop.set()
        await asyncio.wait_for(serving, 15)
        sock.close()


# ---- the response head written with its body ----------------------------------------------------

async def _scripted(scope: Any, receive: Any, send: Any) -> None:
    """Answers by the request path: each a way an app sends (or fails to send) a response."""
    if scope["type"] == "lifespan":
        await _app(scope, receive, send)
        return
    path = scope["path"]
    if path == "/none":
        return  # no response at all: the server answers 500
    status = 204 if path == "/204" else 200
    unframed = path in ("/chunked", "/raise", "/headonly", "/204")
    headers = [] if unframed else [(b"content-length", b"5")]
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"x-kind", path.encode()), *headers]})
    if path == "/raise":
        raise RuntimeError("after the head")
    if path == "/headonly":
        return  # started, never finished: the server ends the connection after the head
    if path == "/204":
        await send({"type": "http.response.body", "body": b""})
    elif path == "/chunked":
        for part in (b"ab", b"", b"cde"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
            await asyncio.sleep(0)  # a stream: its parts in separate loop turns
        await send({"type": "http.response.body", "body": b""})
    else:
        await send({"type": "http.response.body", "body": b"hello"})


def _undated(raw: bytes) -> bytes:
    return b"\r\n".join(line for line in raw.split(b"\r\n") if not line.startswith(b"date: "))


async def _exchange(server: str, requests: bytes) -> bytes:
    """Everything the server sends back for ``requests`` (pipelined), until it closes."""
    async with _served(_scripted, server) as address:
        reader, writer = await asyncio.open_connection(*address)
        writer.write(requests)
        raw = await asyncio.wait_for(reader.read(-1), 10)
        writer.close()
        return raw


@pytest.mark.parametrize(("paths", "unread"), [
    # After the close a pipelined request is never read: the server has closed first.
    (["/plain", "/plain", "/chunked", "/204", "/none"], b"HEAD /plain HTTP/1.1\r\nHost: x\r\n\r\n"),
    # The head, then the connection ends: the head is not lost.
    (["/plain", "/raise"], b""),
    (["/headonly"], b""),
])
async def test_held_head_leaves_the_bytes_on_the_wire_unchanged(paths: list[str],
                                                                unread: bytes) -> None:
    requests = b"".join(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % p.encode() for p in paths[:-1])
    requests += b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % paths[-1].encode()
    tuned = await _exchange("hypercorn", requests + unread)
    stock = await _exchange("hypercorn-stock", requests + unread)
    assert tuned.count(b"HTTP/1.1 ") == len(paths)
    assert _undated(tuned) == _undated(stock)


async def test_held_head_goes_out_with_the_body_in_one_write(
        monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[bytes] = []  # the server's writes to its transport (not the client's request)
    original = asyncio.StreamWriter.write

    def counted(self: Any, data: Any) -> None:
        if data and not bytes(data).startswith(b"GET "):
            writes.append(bytes(data))
        original(self, data)

    monkeypatch.setattr(asyncio.StreamWriter, "write", counted)
    request = b"GET /plain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    for server, expected in (("hypercorn", 1), ("hypercorn-stock", 2)):
        writes.clear()
        raw = await _exchange(server, request)
        assert raw.endswith(b"hello") and len(writes) == expected, (server, writes)
    assert writes[0].startswith(b"HTTP/1.1 200") and writes[1] == b"hello"


async def test_held_head_of_a_waiting_stream_goes_out_within_a_loop_turn() -> None:
    """An app that starts a response and waits (a stream before its first event): the client has
    the head while the app still waits."""
    release = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await release.wait()
        await send({"type": "http.response.body", "body": b"late"})

    async with _served(app) as address:
        try:
            reader, writer = await asyncio.open_connection(*address)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200") and not release.is_set()
            release.set()
            assert b"late" in await asyncio.wait_for(reader.read(-1), 5)
            writer.close()
        finally:
            release.set()


# ---- writes without the send lock: order, back-pressure, a client that leaves -------------------

async def test_a_reader_that_does_not_read_holds_the_writer_back() -> None:
    """128 MiB streamed to a client that does not read: the app's sends block well before half
    of it (the transport's buffer is drained, not grown without bound; here ~6 MiB get out, what
    the two sockets' kernel buffers hold); once the client reads, every byte arrives, in
    order."""
    chunk, count = 1 << 16, 2048
    half_sent, finished = asyncio.Event(), asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(chunk * count).encode())]})
        for i in range(count):
            await send({"type": "http.response.body", "body": bytes([i % 251]) * chunk,
                        "more_body": i < count - 1})
            if i == count // 2:
                half_sent.set()
        finished.set()

    async with _served(app) as address:
        reader, writer = await asyncio.open_connection(*address, limit=1 << 20)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(half_sent.wait(), 1.5)  # held back: nobody reads
        assert hypercorn_tuning.parts_in_use()[4] is hypercorn_tuning.LeanTCPServer
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        for i in range(count):
            assert await asyncio.wait_for(reader.readexactly(chunk), 10) == bytes([i % 251]) * chunk
        await asyncio.wait_for(finished.wait(), 10)
        writer.close()


async def test_a_client_that_leaves_mid_stream_ends_the_stream_quietly() -> None:
    """The client closes while the app streams: the app is told (http.disconnect), its stream
    ends, and nothing raises in the server."""
    errors: list[Any] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    ended = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _app(scope, receive, send)
            return
        await receive()  # the (empty) request body
        gone = asyncio.ensure_future(receive())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        while not gone.done():
            await send({"type": "http.response.body", "body": b"x" * 4096, "more_body": True})
            await asyncio.sleep(0)
        assert gone.result()["type"] == "http.disconnect"
        ended.set()

    try:
        async with _served(app) as address:
            reader, writer = await asyncio.open_connection(*address)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            await asyncio.wait_for(reader.readexactly(1 << 20), 10)
            writer.close()
            await asyncio.wait_for(ended.wait(), 10)
    finally:
        loop.set_exception_handler(None)
    assert errors == []
