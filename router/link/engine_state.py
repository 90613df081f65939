"""Per-engine link state kept by the engine client: sockets, health, in-flight requests, load."""

from __future__ import annotations

import asyncio
import enum
from typing import TYPE_CHECKING, Any

import msgspec
import zmq
import zmq.asyncio

from router.config import EngineSpec
from wire.engine import EngineReadyResponse

if TYPE_CHECKING:
    from router.link.request_stream import RequestStream


# Every engine the router links is data-parallel rank 0 of its own handshake: vLLM names an
# engine's sockets by its rank as two little-endian bytes.
ENGINE_IDENTITY = (0).to_bytes(2, "little")


class EngineStatus(enum.Enum):
    CONNECTING = "connecting"  # nothing heard yet: waiting for a HELLO or a reconnecting engine
    HANDSHAKING = "handshaking"  # HELLO answered, the engine is loading its model
    READY = "ready"
    DEAD = "dead"


class LinkCounters(msgspec.Struct):
    requests: int = 0
    messages: int = 0
    tokens: int = 0
    stray_outputs: int = 0
    decode_errors: int = 0
    connects: int = 0
    deaths: int = 0


def _endpoint(sock: zmq.asyncio.Socket, advertise_host: str | None = None) -> str:
    endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    # A wildcard bind cannot be dialled: engines reach it at the advertised host, else loopback.
    v4, v6 = (advertise_host, advertise_host) if advertise_host else ("127.0.0.1", "[::1]")
    return endpoint.replace("//0.0.0.0:", f"//{v4}:").replace("//[::]:", f"//{v6}:")


class QueueCounts(msgspec.Struct, gc=False):
    """The two scheduler_stats fields routing reads per request: decoding only these skips
    building the whole map."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0


_STATS = msgspec.msgpack.Decoder(dict[str, Any])
_COUNTS = msgspec.msgpack.Decoder(QueueCounts)
_NO_COUNTS = QueueCounts()


class EngineState:
    """Everything the client knows about one engine; read by the router for health and load."""

    def __init__(
        self,
        spec: EngineSpec,
        handshake: zmq.asyncio.Socket,
        input_socket: zmq.asyncio.Socket,
        output_socket: zmq.asyncio.Socket,
    ) -> None:
        self.spec = spec
        self.handshake = handshake
        self.input = input_socket
        self.output = output_socket
        self.handshake_endpoint = _endpoint(handshake, spec.advertise_host)
        self.input_endpoint = _endpoint(input_socket, spec.advertise_host)
        self.output_endpoint = _endpoint(output_socket, spec.advertise_host)
        self.identity = ENGINE_IDENTITY
        self.status = EngineStatus.CONNECTING
        self.ready: EngineReadyResponse | None = None
        self.adopted = False
        self.death_reason: str | None = None
        # Declared dead for silence only: it may wake up, so the client keeps probing it.
        self.maybe_hung = False
        self.ready_event = asyncio.Event()
        self.connect_event = asyncio.Event()  # set on every (re)connect; waiters clear it
        self.in_flight: dict[str, RequestStream] = {}
        self._stats_raw: msgspec.Raw | None = None
        self._stats: dict[str, Any] | None = None
        self._counts: QueueCounts | None = None
        self.last_output = 0.0
        self.counters = LinkCounters()
        self.tasks: list[asyncio.Task[None]] = []  # listener + control, owned by the client

    @property
    def handshake_port(self) -> int:
        """The TCP port to pass to the engine as ``--data-parallel-rpc-port`` (a handshake bound
        on port 0 learns its port here)."""
        return int(self.handshake_endpoint.rsplit(":", 1)[1])

    def set_raw_stats(self, raw: msgspec.Raw) -> None:
        self._stats_raw = raw
        self._stats = None
        self._counts = None

    @property
    def scheduler_stats(self) -> dict[str, Any] | None:
        """The engine's last scheduler_stats map (num_running_reqs, kv_cache_usage, ...)."""
        if self._stats is None and self._stats_raw is not None:
            try:
                self._stats = _STATS.decode(self._stats_raw)
            except msgspec.DecodeError:
                self.counters.decode_errors += 1
                self._stats_raw = None
        return self._stats

    @property
    def queue_counts(self) -> QueueCounts:
        """Running and waiting requests from the last scheduler_stats (zeros before any)."""
        counts = self._counts
        if counts is None:
            counts = _NO_COUNTS
            if self._stats_raw is not None:
                try:
                    counts = _COUNTS.decode(self._stats_raw)
                except msgspec.DecodeError:
                    self.counters.decode_errors += 1
            self._counts = counts
        return counts

    @property
    def num_in_flight(self) -> int:
        return len(self.in_flight)

    def sockets(self) -> tuple[zmq.asyncio.Socket, ...]:
        return (self.handshake, self.input, self.output)
