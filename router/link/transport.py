"""The engine link as routing sees it, whatever carries it: one interface over ZMQ and HTTP engines.

The dispatcher, the fleet and the front read engines through ``EngineView`` (status, load,
in-flight requests, what the engine said when it turned ready) and talk to them through
``EngineLinks``: ``submit`` -> a ``RequestStream`` of ``EngineCoreOutput`` (the output pipeline
consumes the same stream from either transport), ``abort``, ``add_engine`` / ``remove_engine``.
``EngineLinks`` holds one client per transport (``router.link.engine_client.EngineClient`` for
headless engines over ZMQ, ``router.link.http_client.HttpEngineClient`` for `vllm serve` pods)
and keeps one ``engines`` map over both, so policy, index, retries, output pipeline and metrics
are shared. A request goes straight to its engine's client: the ZMQ hot path pays one dict
lookup and one call more.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, Protocol

from router.config import EngineSpec
from router.link.engine_client import EngineClient, EngineLinkError
from router.link.engine_state import EngineStatus, QueueCounts
from router.link.http_client import HttpEngineClient
from router.link.request_stream import RequestStream
from wire.engine import EngineCoreRequest, EngineReadyResponse


class Counters(Protocol):
    """What both transports count per engine (each counts more of its own)."""

    requests: int
    tokens: int
    connects: int
    deaths: int


class EngineView(Protocol):
    """One engine as routing reads it (``router.link.engine_state.EngineState`` for ZMQ,
    ``router.link.http_state.HttpEngineState`` for HTTP)."""

    spec: EngineSpec
    status: EngineStatus
    death_reason: str | None
    # What the engine said once ready: its ready map (ZMQ), or for a pod what its
    # /v1/models and /kv_event_sources answered (block_size 0: learned from its KV events).
    ready: EngineReadyResponse | None
    adopted: bool
    in_flight: dict[str, RequestStream]

    @property
    def counters(self) -> Counters: ...

    @property
    def queue_counts(self) -> QueueCounts: ...

    @property
    def scheduler_stats(self) -> dict[str, Any] | None: ...

    @property
    def num_in_flight(self) -> int: ...


class EngineLinks:
    """Every engine of the fleet, over its own transport, as one client."""

    def __init__(self, specs: Iterable[EngineSpec], zmq: EngineClient,
                 http: HttpEngineClient) -> None:
        self.zmq = zmq
        self.http = http
        self._specs = list(specs)
        # name -> view, over both transports (read per request: one dict, no merging then).
        self.engines: dict[str, EngineView] = {}
        self._http_names: set[str] = set()

    async def __aenter__(self) -> EngineLinks:
        await self.start()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def start(self) -> None:
        await self.zmq.start()
        await self.http.start()
        for spec in self._specs:
            self.add_engine(spec)

    async def close(self) -> None:
        await self.http.close()
        await self.zmq.close()

    def add_engine(self, spec: EngineSpec) -> EngineView:
        """Link one more engine (ZMQ: bind its sockets; HTTP: start probing its pod)."""
        if spec.name in self.engines:
            raise ValueError(f"engine {spec.name!r} already added")
        view: EngineView
        if spec.is_http:
            view = self.http.add_engine(spec)
            self._http_names.add(spec.name)
        else:
            view = self.zmq.add_engine(spec)
        self.engines[spec.name] = view
        return view

    async def remove_engine(self, name: str) -> None:
        if self.engines.pop(name, None) is None:
            return
        if name in self._http_names:
            self._http_names.discard(name)
            await self.http.remove_engine(name)
        else:
            await self.zmq.remove_engine(name)

    def endpoint(self, name: str) -> str:
        """Where the engine is reached: a pod's URL, or the handshake address engines dial."""
        view = self.engines[name]
        if view.spec.is_http:
            return view.spec.address
        return self.zmq.engines[name].handshake_endpoint

    async def wait_ready(self, timeout: float, engines: Sequence[str] | None = None) -> None:
        names = list(self.engines) if engines is None else list(engines)
        http = [n for n in names if n in self._http_names]
        zmq = [n for n in names if n not in self._http_names]
        if zmq:
            await self.zmq.wait_ready(timeout, zmq)
        if http:
            await self.http.wait_ready(timeout, http)

    async def submit(self, engine: str, request: EngineCoreRequest) -> RequestStream:
        """Send the request to its engine; the stream yields its outputs until one finishes it."""
        if engine in self._http_names:
            return await self.http.submit(engine, request)
        return await self.zmq.submit(engine, request)

    async def call_utility(self, engine: str, method: str, *args: Any,
                           timeout: float = 30.0) -> Any:
        """Run ``EngineCore.<method>(*args)`` on a ZMQ engine. A pod's HTTP API has no utility
        calls (LoRA adapters on pods are not managed by the router): EngineLinkError."""
        if engine in self._http_names:
            raise EngineLinkError(f"engine {engine!r} is reached over HTTP: no utility calls")
        return await self.zmq.call_utility(engine, method, *args, timeout=timeout)

    async def abort(self, request_ids: Iterable[str]) -> None:
        """Abort requests wherever they run; their streams end with an ABORT output at once."""
        ids = list(request_ids)
        await self.zmq.abort(ids)
        if self._http_names:
            await self.http.abort(ids)
