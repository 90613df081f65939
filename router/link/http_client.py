"""The HTTP engine transport: `vllm serve` pods reached by URL, through vLLM's token-in API.

Per pod: a pool of keep-alive connections (router/link/http_conn.py), and one monitor task that
turns the pod ready once ``/health`` answers 200 (then reads its ``/v1/models`` and, unless
given in the config, ``/kv_event_sources``), probes ``/health`` every ``health_interval``
(counted from the pod's last full answer if later: a pod serving steadily is not probed) and
scrapes ``/metrics`` every ``load_interval``, or every ``load_interval_quiet`` while the pod
counts no request but ours (router/link/http_state.py). A stream the link
cuts (connection refused or lost, a timeout) makes the monitor probe at once: a pod that fails
its probe is dead (no new requests) until one succeeds again; a new process start time in its
metrics is a restarted pod (``counters.connects`` rises, as for a ZMQ engine's new handshake).

``submit`` writes the generate request on a pooled connection and returns the request's
``RequestStream`` (router/link/generate_stream.py fills it); ``abort`` closes the request's
connection (vLLM aborts a request whose client left) and also posts its id to
``/inference/v1/abort_requests``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

import msgspec

from router.config import EngineSpec, LinkConfig
from router.link.engine_state import EngineStatus
from router.link.generate_stream import GenerateReader, generate_body, request_bytes
from router.link.http_conn import Connection, ConnectionClosed, Pool
from router.link.http_state import (
    HttpEngineState,
    health_due,
    parse_block_size,
    parse_load,
    scrape_interval,
)
from router.link.request_stream import RequestStream
from serving.errors import (
    APIError,
    EngineDeadError,
    EngineLinkError,
    EngineUnavailableError,
)
from wire.engine import EngineCoreOutput, EngineCoreRequest, EngineReadyResponse, FinishReason
from wire.token_api import (
    ABORT_PATH,
    GENERATE_PATH,
    KV_SOURCES_PATH,
    POD_REQUEST_PREFIX,
    ModelList,
)

log = logging.getLogger("kvroute.link.http")

_MODELS = msgspec.json.Decoder(ModelList)
_SOURCES = msgspec.json.Decoder(dict[str, dict[str, object]])
_ENCODER = msgspec.json.Encoder()
# The largest answer read from a control endpoint (/metrics of a big pod is ~100 KB).
MAX_CONTROL_BYTES = 8 * 1024 * 1024


class _Collect:
    """Reads a whole (small) response into a future: (status, body)."""

    __slots__ = ("future", "status", "body")

    def __init__(self, future: asyncio.Future[tuple[int, bytes]]) -> None:
        self.future = future
        self.status = 0
        self.body = b""

    def on_head(self, status: int) -> None:
        self.status = status

    def on_body(self, data: bytes) -> None:
        if len(self.body) + len(data) > MAX_CONTROL_BYTES:
            self.on_error(EngineUnavailableError(f"answer over {MAX_CONTROL_BYTES} bytes"))
            return
        self.body += data

    def on_end(self) -> None:
        if not self.future.done():
            self.future.set_result((self.status, self.body))

    def on_error(self, exc: EngineLinkError) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


class _Exchange:
    """A request on the wire: its connection and reader (abort closes the connection)."""

    __slots__ = ("engine", "conn", "reader", "request", "retried")

    def __init__(self, engine: HttpEngineState, conn: Connection, reader: GenerateReader,
                 request: bytes) -> None:
        self.engine = engine
        self.conn = conn
        self.reader = reader
        self.request = request
        self.retried = False


class HttpEngineClient:
    """Links to `vllm serve` pods over HTTP; the same calls as the ZMQ ``EngineClient``."""

    def __init__(self, link: LinkConfig | None = None, *, dead_after: float = 30.0,
                 max_logprobs: int = 20) -> None:
        self.link = link or LinkConfig()
        # A stream silent this long is cut (the ZMQ link's engine_dead_after, per request).
        self.dead_after = dead_after
        # The engines' --max-logprobs: a pod is asked for one more than requested within it.
        self.max_logprobs = max_logprobs
        self.engines: dict[str, HttpEngineState] = {}
        self._exchanges: dict[str, _Exchange] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._auth = (b"authorization: Bearer " + self.link.engine_api_key.encode() + b"\r\n"
                      if self.link.engine_api_key else b"")
        self._started = False

    async def __aenter__(self) -> HttpEngineClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        self._started = True

    async def close(self) -> None:
        for name in list(self.engines):
            await self.remove_engine(name)
        for task in list(self._background):
            task.cancel()
        for task in list(self._background):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ---- engines ----

    def add_engine(self, spec: EngineSpec) -> HttpEngineState:
        if not self._started:
            raise RuntimeError("add_engine() needs a started client")
        if spec.name in self.engines:
            raise ValueError(f"engine {spec.name!r} already added")
        assert spec.url is not None
        parts = urlsplit(spec.url)
        tls = parts.scheme == "https"
        host = parts.hostname or "127.0.0.1"
        port = parts.port or (443 if tls else 80)
        link = self.link
        pool = Pool(spec.name, host, port, tls=tls, connect_timeout=link.http_connect_timeout,
                    first_byte_timeout=link.http_first_byte_timeout,
                    read_timeout=self.dead_after, idle_after=link.http_pool_idle)
        eng = HttpEngineState(spec, pool, link.http_load_max_age, parts.netloc)
        self.engines[spec.name] = eng
        eng.tasks.append(asyncio.create_task(self._monitor(eng), name=f"monitor-{spec.name}"))
        return eng

    async def remove_engine(self, name: str) -> None:
        eng = self.engines.pop(name, None)
        if eng is None:
            return
        for task in eng.tasks:
            task.cancel()
        for task in eng.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        gone = EngineUnavailableError(f"engine {name!r} was removed")
        for rid in list(eng.in_flight):
            exchange = self._exchanges.pop(rid, None)
            stream = eng.in_flight.pop(rid)
            if exchange is not None:
                exchange.conn.abandon()
            stream.fail(gone)
        eng.pool.close()

    async def wait_ready(self, timeout: float, engines: Sequence[str] | None = None) -> None:
        names = list(self.engines) if engines is None else list(engines)
        try:
            async with asyncio.timeout(timeout):
                await asyncio.gather(*(self._engine(n).ready_event.wait() for n in names))
        except TimeoutError:
            missing = [f"{n} at {self.engines[n].spec.url}" for n in names
                       if not self.engines[n].ready_event.is_set()]
            raise EngineUnavailableError(
                f"no answer from {', '.join(missing)} within {timeout:.0f}s: is `vllm serve "
                "--enable-scale-out` running there (/health answering 200)?") from None

    def _engine(self, name: str) -> HttpEngineState:
        try:
            return self.engines[name]
        except KeyError:
            raise EngineUnavailableError(f"unknown engine {name!r}") from None

    # ---- requests ----

    async def submit(self, engine: str, request: EngineCoreRequest) -> RequestStream:
        """Write the generate request; the stream yields its outputs until one finishes it."""
        eng = self._engine(engine)
        rid = request.request_id
        if rid in self._exchanges:
            raise ValueError(f"request id {rid!r} is already in flight")
        if eng.status is EngineStatus.DEAD:
            raise EngineDeadError(f"engine {engine!r} is dead: {eng.death_reason}")
        body = generate_body(request, self.max_logprobs)
        stream = RequestStream(rid, engine)
        params = request.sampling_params
        reader = GenerateReader(stream, params.logprobs if params is not None else None,
                                self._finished)
        wire = request_bytes(eng.host_header, GENERATE_PATH, body, self._auth)
        conn = await self._connect(eng)
        exchange = _Exchange(eng, conn, reader, wire)
        eng.in_flight[rid] = stream
        self._exchanges[rid] = exchange
        conn.send(wire, _Guard(self, exchange))
        eng.counters.requests += 1
        return stream

    async def _connect(self, eng: HttpEngineState) -> Connection:
        try:
            return await eng.pool.acquire()
        except EngineLinkError:
            eng.probe_now.set()
            raise

    def _finished(self, reader: GenerateReader, error: EngineLinkError | APIError | None) -> None:
        exchange = self._exchanges.pop(reader.request_id, None)
        if exchange is None:
            return
        eng = exchange.engine
        eng.in_flight.pop(reader.request_id, None)
        eng.counters.tokens += reader.tokens
        if error is None:
            eng.answered = time.monotonic()  # its engine is alive: /health can wait
        elif isinstance(error, EngineLinkError):
            eng.counters.stream_errors += 1
            eng.probe_now.set()
        else:
            eng.counters.refused += 1

    def _resend(self, exchange: _Exchange) -> None:
        """A reused keep-alive connection closed under a request the pod never answered (it
        was timing the connection out as we wrote): the same request once more on a new one."""
        exchange.retried = True

        async def again() -> None:
            try:
                conn = await self._connect(exchange.engine)
            except EngineLinkError as exc:
                exchange.reader.on_error(exc)
                return
            if exchange.reader.request_id not in self._exchanges:  # aborted meanwhile
                exchange.engine.pool.release(conn)
                return
            exchange.conn = conn
            conn.send(exchange.request, _Guard(self, exchange))

        self._spawn(again())

    async def abort(self, request_ids: Iterable[str]) -> None:
        """Abort requests; their streams end with a FinishReason.ABORT output right away."""
        by_engine: dict[HttpEngineState, list[str]] = {}
        for rid in request_ids:
            exchange = self._exchanges.pop(rid, None)
            if exchange is None:
                continue
            eng = exchange.engine
            stream = eng.in_flight.pop(rid, None)
            exchange.conn.abandon()  # the pod sees its client leave and aborts the request
            eng.counters.tokens += exchange.reader.tokens
            if stream is not None:
                stream.finish(EngineCoreOutput(rid, [], finish_reason=FinishReason.ABORT))
            by_engine.setdefault(eng, []).append(POD_REQUEST_PREFIX + rid)
        for eng, ids in by_engine.items():
            self._spawn(self._post_abort(eng, ids))

    async def _post_abort(self, eng: HttpEngineState, pod_ids: list[str]) -> None:
        body = _ENCODER.encode({"request_ids": pod_ids})
        with contextlib.suppress(EngineLinkError, TimeoutError):
            await self._call(eng, "POST", ABORT_PATH, body)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---- control requests and the monitor ----

    async def _call(self, eng: HttpEngineState, method: str, path: str,
                    body: bytes = b"") -> tuple[int, bytes]:
        """One small request (health, metrics, models, abort), bounded by the connect timeout."""
        conn = await eng.pool.acquire()
        future: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        head = (f"{method} {path} HTTP/1.1\r\nhost: {eng.host_header}\r\n").encode()
        if body:
            head += b"content-type: application/json\r\ncontent-length: " + str(
                len(body)).encode() + b"\r\n"
        conn.send(head + self._auth + b"\r\n" + body, _Collect(future))
        try:
            async with asyncio.timeout(self.link.http_connect_timeout):
                return await future
        except BaseException:
            conn.abandon()
            raise

    async def _monitor(self, eng: HttpEngineState) -> None:
        link = self.link
        health = link.http_health_interval
        last_health = next_scrape = 0.0
        while True:
            now = time.monotonic()
            if eng.status is not EngineStatus.READY:
                await self._try_ready(eng)
                next_scrape = 0.0
            else:
                if eng.probe_now.is_set() or health_due(now, last_health, eng.answered, health):
                    eng.probe_now.clear()
                    last_health = now
                    await self._check_health(eng)
                if eng.status is EngineStatus.READY and time.monotonic() >= next_scrape:
                    scraped = await self._scrape(eng) is not None
                    next_scrape = time.monotonic() + scrape_interval(
                        eng.load if scraped else None, link.http_load_interval,
                        link.http_load_interval_quiet)
                eng.pool.prune()
            if eng.status is EngineStatus.READY:
                now = time.monotonic()
                wait = min(next_scrape, max(last_health, eng.answered) + health) - now
            else:
                wait = health
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(wait, 0.0)):
                    await eng.probe_now.wait()

    async def _try_ready(self, eng: HttpEngineState) -> None:
        eng.probe_now.clear()
        try:
            status, _ = await self._call(eng, "GET", "/health")
            if status != 200:
                raise EngineUnavailableError(f"/health answered {status}")
            metrics = await self._scrape(eng)
            ready = await self._describe(eng, metrics)
        except (EngineLinkError, TimeoutError, msgspec.DecodeError) as exc:
            if eng.status is EngineStatus.CONNECTING:
                log.debug("engine %s not ready yet: %s", eng.spec.name, exc)
            return
        eng.ready = ready
        self._mark_ready(eng)

    async def _describe(self, eng: HttpEngineState, metrics: bytes | None) -> EngineReadyResponse:
        """The pod's context length (/v1/models), KV-event publisher (/kv_event_sources, unless
        the config names the endpoints) and KV block size (its ``metrics`` body, unless
        configured), as a ready map."""
        status, body = await self._call(eng, "GET", "/v1/models")
        if status != 200:
            raise EngineUnavailableError(f"/v1/models answered {status}")
        models = _MODELS.decode(body).data
        max_len = (models[0].max_model_len or 0) if models else 0
        kv: dict[str, object] | None = None
        if eng.spec.kv_events is None:
            status, body = await self._call(eng, "GET", KV_SOURCES_PATH)
            sources = _SOURCES.decode(body) if status == 200 else {}
            if len(sources) > 1:
                log.warning("engine %s has %d data-parallel ranks: KV events of rank 0 only "
                            "are followed", eng.spec.name, len(sources))
            kv = sources.get("0") or (next(iter(sources.values())) if sources else None)
        block_size = eng.spec.block_size
        if block_size is None and metrics is not None:
            block_size = parse_block_size(metrics)
        return EngineReadyResponse(max_model_len=max_len, block_size=block_size or 0,
                                   kv_events_config=kv)

    async def _check_health(self, eng: HttpEngineState) -> None:
        try:
            status, _ = await self._call(eng, "GET", "/health")
        except (EngineLinkError, TimeoutError) as exc:
            self._mark_dead(eng, f"/health failed ({exc})")
            return
        if status != 200:
            self._mark_dead(eng, f"/health answered {status}")

    async def _scrape(self, eng: HttpEngineState) -> bytes | None:
        """Read the pod's load from its /metrics; the body, or None when the scrape failed."""
        try:
            status, body = await self._call(eng, "GET", "/metrics")
        except (EngineLinkError, TimeoutError):
            eng.counters.scrape_errors += 1
            return None
        if status != 200:
            eng.counters.scrape_errors += 1
            return None
        eng.counters.scrapes += 1
        load = parse_load(body, time.monotonic(), len(eng.in_flight))
        previous = eng.load
        eng.load = load
        if (previous is not None and load.start_time is not None
                and previous.start_time is not None and load.start_time != previous.start_time
                and eng.status is EngineStatus.READY):
            log.warning("engine %s restarted (a new process start time)", eng.spec.name)
            eng.counters.connects += 1
        return body

    def _mark_ready(self, eng: HttpEngineState) -> None:
        eng.status = EngineStatus.READY
        eng.death_reason = None
        eng.counters.connects += 1
        eng.ready_event.set()
        log.info("engine %s ready at %s", eng.spec.name, eng.spec.url)

    def _mark_dead(self, eng: HttpEngineState, reason: str) -> None:
        eng.status = EngineStatus.DEAD
        eng.death_reason = reason
        eng.counters.deaths += 1
        eng.ready_event.clear()
        eng.load = None
        log.warning("engine %s unavailable: %s", eng.spec.name, reason)


class _Guard:
    """The exchange's reader on its connection: a reused connection that closes before the
    response starts sends the request once more on a new one; everything else goes to the
    GenerateReader."""

    __slots__ = ("client", "exchange")

    def __init__(self, client: HttpEngineClient, exchange: _Exchange) -> None:
        self.client = client
        self.exchange = exchange

    def on_head(self, status: int) -> None:
        self.exchange.reader.on_head(status)

    def on_body(self, data: bytes) -> None:
        self.exchange.reader.on_body(data)

    def on_end(self) -> None:
        self.exchange.reader.on_end()

    def on_error(self, exc: EngineLinkError) -> None:
        ex = self.exchange
        if (isinstance(exc, ConnectionClosed) and not ex.reader.started and not ex.retried
                and ex.conn.exchanges > 1):
            self.client._resend(ex)
            return
        ex.reader.on_error(exc)
