"""Per-engine link state kept by the engine client: sockets, health, in-flight requests, load."""

from __future__ import annotations

import asyncio
import enum
import math
from typing import TYPE_CHECKING, Annotated, Any

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
    # Hostile or broken peers (see docs/operations.md "Security"): each is dropped, never fatal.
    malformed_frames: int = 0  # control messages with the wrong frame count or type
    refused_identities: int = 0  # input-socket messages from a peer that is not the engine
    refused_handshakes: int = 0  # HELLO / READY where the protocol does not allow one
    refused_stats: int = 0  # scheduler_stats of the wrong type or out of range
    forged_deaths: int = 0  # ENGINE_CORE_DEAD while the engine still answers
    task_restarts: int = 0  # a background task failed and was restarted
    # Health (router/link/engine_health.py): connections the input/output sockets lost, and
    # probes sent because of one or of a quiet spell.
    disconnects: int = 0
    health_probes: int = 0


def _endpoint(sock: zmq.asyncio.Socket, advertise_host: str | None = None) -> str:
    endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    # A wildcard bind cannot be dialled: engines reach it at the advertised host, else loopback.
    v4, v6 = (advertise_host, advertise_host) if advertise_host else ("127.0.0.1", "[::1]")
    return endpoint.replace("//0.0.0.0:", f"//{v4}:").replace("//[::]:", f"//{v6}:")


# No engine runs or queues more requests than this; a larger count is forged or corrupt.
MAX_QUEUE_COUNT = 1_000_000
_Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_QUEUE_COUNT)]


class QueueCounts(msgspec.Struct, gc=False):
    """The two scheduler_stats fields routing reads per request: decoding only these skips
    building the whole map. Typed and bounded, so a forged count fails to decode."""

    num_running_reqs: _Count = 0
    num_waiting_reqs: _Count = 0


# The stats fields the router reads, with the range a real engine reports.
STAT_BOUNDS: dict[str, tuple[float, float]] = {
    "num_running_reqs": (0, MAX_QUEUE_COUNT),
    "num_waiting_reqs": (0, MAX_QUEUE_COUNT),
    "kv_cache_usage": (0.0, 1.0),
}


def stats_in_bounds(stats: dict[str, Any]) -> bool:
    """Every field in ``STAT_BOUNDS`` that is present is a finite number in its range."""
    for key, (lo, hi) in STAT_BOUNDS.items():
        if key not in stats:
            continue
        value = stats[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if not (math.isfinite(value) and lo <= value <= hi):
            return False
    return True


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
        # The last stats that passed the checks: a refused map leaves routing where it was.
        self._good_stats: dict[str, Any] | None = None
        self._good_counts = _NO_COUNTS
        self._refusal_counted = False
        # The handshake identity whose HELLO was answered (READY is accepted from it only).
        self.hello_identity: bytes | None = None
        self.verifying_death = False  # an ENGINE_CORE_DEAD is being checked (see the client)
        self.checking = False  # a health probe is out (router/link/engine_health.py)
        # Monitor sockets of the input and output sockets (router/link/engine_health.py).
        self.monitors: list[zmq.asyncio.Socket] = []
        # Set whenever something is dropped and counted (a stranger's or a malformed message):
        # for tests and tools that wait for the drop; waiters clear it.
        self.dropped_event = asyncio.Event()
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
        self._refusal_counted = False

    def clear_stats(self) -> None:
        """Forget the load a previous process (or link) reported: a new or re-adopted engine's
        load is what it reports next, zeros until then."""
        self._stats_raw = None
        self._stats = None
        self._counts = None
        self._good_stats = None
        self._good_counts = _NO_COUNTS
        self._refusal_counted = False

    def _refuse_stats(self) -> None:
        # One count per refused map, whichever reader finds it first.
        if not self._refusal_counted:
            self._refusal_counted = True
            self.counters.refused_stats += 1
            self.dropped_event.set()

    @property
    def scheduler_stats(self) -> dict[str, Any] | None:
        """The engine's last valid scheduler_stats map (num_running_reqs, kv_cache_usage, ...):
        a map of the wrong type or with a field out of ``STAT_BOUNDS`` is counted and ignored."""
        if self._stats is None and self._stats_raw is not None:
            try:
                stats = _STATS.decode(self._stats_raw)
            except msgspec.DecodeError:
                self._refuse_stats()
            else:
                if stats_in_bounds(stats):
                    self._good_stats = stats
                else:
                    self._refuse_stats()
            self._stats = self._good_stats
        return self._stats

    @property
    def queue_counts(self) -> QueueCounts:
        """Running and waiting requests from the last valid scheduler_stats (zeros before any)."""
        counts = self._counts
        if counts is None:
            counts = self._good_counts
            if self._stats_raw is not None:
                try:
                    counts = self._good_counts = _COUNTS.decode(self._stats_raw)
                except msgspec.DecodeError:  # incl. ValidationError: out of bounds
                    self._refuse_stats()
            self._counts = counts
        return counts

    @property
    def num_in_flight(self) -> int:
        return len(self.in_flight)

    def sockets(self) -> tuple[zmq.asyncio.Socket, ...]:
        return (self.handshake, self.input, self.output)
