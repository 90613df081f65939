"""Frontend side of vLLM's EngineCore link: handshake, ADD / ABORT / UTILITY, per-request streams.

Per engine the client binds three sockets, as vLLM's ``MPClient`` does: a ROUTER for the headless
handshake (engines started with ``vllm serve M --headless --data-parallel-address A
--data-parallel-rpc-port P`` connect to it), a ROUTER the engine's input DEALER connects to, and a
PULL its output PUSH connects to. Engine identities are ``dp_rank.to_bytes(2, "little")``, so every
DP=1 engine is ``b"\\x00\\x00"``: one input socket per engine keeps them apart.

Errors live in ``serving.errors`` (re-exported here).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, cast

import msgspec
import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator

from router.config import EngineSpec
from router.link.engine_health import close_monitors, idle_due, open_monitors, watch_connections
from router.link.engine_outputs import NIL, OutputDecoder, decode_engine_outputs
from router.link.engine_state import EngineState, EngineStatus
from router.link.request_stream import RequestStream
from serving.errors import (
    EngineDeadError,
    EngineLinkError,
    EngineUnavailableError,
    UtilityCallError,
)
from wire.engine import (
    ENGINE_CORE_DEAD,
    REQ_ABORT,
    REQ_ADD,
    REQ_UTILITY,
    EngineCoreOutput,
    EngineCoreRequest,
    EngineHandshakeMetadata,
    EngineReadyResponse,
    EngineZmqAddresses,
    FinishReason,
    HandshakeStatus,
    enc_hook,
)

__all__ = [
    "EngineClient",
    "EngineDeadError",
    "EngineLinkError",
    "EngineSpec",
    "EngineState",
    "EngineStatus",
    "EngineUnavailableError",
    "decode_engine_outputs",
    "RequestStream",
    "UtilityCallError",
]


log = logging.getLogger("kvroute.link")

# Largest message accepted on an engine's output socket. vLLM's biggest outputs are prompt
# logprobs: a 128k-token prompt with 20 logprobs is ~21 x 128k x (8 + 4 + 8) bytes ~ 54 MiB of aux
# frames; a step's batch of sampled-token logprobs is far smaller. 256 MiB leaves room for longer
# contexts and refuses (libzmq drops the peer) anything a real engine does not send.
DEFAULT_MAX_MSG_SIZE = 256 * 1024 * 1024
# The handshake and input sockets carry small maps only (HELLO / READY / the ready map).
CONTROL_MAX_MSG_SIZE = 1024 * 1024
# How long a HELLO or ENGINE_CORE_DEAD waits for a linked engine's answer before it is believed:
# a live engine answers a utility call within a scheduler step, a dead one never does.
VERIFY_TIMEOUT = 2.0
# A failed background task restarts after this pause (a failure that repeats cannot spin).
RESTART_DELAY = 0.1
# A removed engine's input socket lingers this long (ms) for the abort of the requests cut.
ABORT_LINGER_MS = 1000

# Utility used to find engines reconnecting after a router restart: cheap, no side effects.
PROBE_METHOD = "is_sleeping"
READY_MAP_WAIT_MS = 5000
# The control poll of a linked engine: a linked engine needs no probing, and every wake-up of a
# zmq.asyncio poll costs CPU (syscalls, a future) on an otherwise idle router. This only bounds
# how late a probe of an engine declared hung starts.
LINKED_POLL_MS = 1000

# libzmq's flags and options as plain ints: pyzmq's are enums, whose | runs in Python.
_NOWAIT = int(zmq.DONTWAIT)
_MORE = int(zmq.SNDMORE) | _NOWAIT
_LAST = _NOWAIT
_EVENTS = int(zmq.EVENTS)
_RCVMORE = int(zmq.RCVMORE)
_POLLIN = int(zmq.POLLIN)


class _Phase(enum.Enum):
    NEW = 0
    STARTED = 1
    CLOSED = 2


class EngineClient:
    """Links to many engines; one listener task per engine demultiplexes outputs per request."""

    def __init__(
        self,
        specs: Iterable[EngineSpec] = (),
        *,
        client_index: int = 0,
        dead_after: float = 30.0,
        reconnect_grace: float = 2.0,
        probe_interval: float = 0.1,
        max_msg_size: int = DEFAULT_MAX_MSG_SIZE,
        allowed_peers: Sequence[str] | None = None,
        idle_probe_after: float = 5.0,
    ) -> None:
        self.client_index = client_index
        # A linked engine with no work, silent this long, is probed (router/link/engine_health).
        self.idle_probe_after = idle_probe_after
        # ZMQ_MAXMSGSIZE of the output socket: a larger message disconnects its sender.
        self.max_msg_size = max_msg_size
        # IP addresses admitted on the engine-facing TCP sockets (a ZAP handler, pyzmq's
        # authenticator); None admits any peer that reaches the bound interface.
        self.allowed_peers = tuple(allowed_peers) if allowed_peers is not None else None
        self._auth: AsyncioAuthenticator | None = None
        # Silence longer than this while requests are in flight means the engine is gone.
        self.dead_after = dead_after
        # Sends to an engine that is reconnecting fail with EHOSTUNREACH for a short while.
        self.reconnect_grace = reconnect_grace
        self.probe_interval = probe_interval
        self.engines: dict[str, EngineState] = {}
        self._specs = list(specs)
        self._ctx: zmq.asyncio.Context | None = None
        self._phase = _Phase.NEW
        self._tasks: list[asyncio.Task[None]] = []
        self._request_engine: dict[str, EngineState] = {}
        self._call_ids = itertools.count(1)
        self._utility: dict[int, tuple[EngineState, asyncio.Future[Any]]] = {}
        self._sync_inputs: dict[EngineState, zmq.Socket[bytes]] = {}
        self._encoder = msgspec.msgpack.Encoder(enc_hook=enc_hook)
        self._out_decoder = OutputDecoder()  # logprob arrays read by their byte layout
        self._ready_decoder = msgspec.msgpack.Decoder(EngineReadyResponse)
        self._status_decoder = msgspec.msgpack.Decoder(HandshakeStatus)

    # ---- lifecycle ----

    async def __aenter__(self) -> EngineClient:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> None:
        if self._phase is not _Phase.NEW:
            raise RuntimeError("EngineClient.start() called twice")
        self._ctx = zmq.asyncio.Context()
        if self.allowed_peers is not None:
            self._auth = AsyncioAuthenticator(self._ctx, log=log)
            self._auth.start()
            self._auth.allow(*self.allowed_peers)
        self._phase = _Phase.STARTED
        for spec in self._specs:
            self.add_engine(spec)
        self._tasks.append(asyncio.create_task(self._watchdog(), name="engine-watchdog"))

    async def close(self) -> None:
        if self._phase is _Phase.CLOSED:
            return
        self._phase = _Phase.CLOSED
        tasks = self._tasks + [t for eng in self.engines.values() for t in eng.tasks]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        closed = EngineUnavailableError("engine client closed")
        for eng in self.engines.values():
            eng.tasks.clear()
            self._fail_engine_requests(eng, closed)
            self._sync_inputs.pop(eng, None)
            close_monitors(eng)
            for sock in eng.sockets():
                sock.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
        if self._ctx is not None:
            self._ctx.term()

    def add_engine(self, spec: EngineSpec) -> EngineState:
        """Bind the engine's three sockets and start its tasks (also after start())."""
        if self._phase is not _Phase.STARTED or self._ctx is None:
            raise RuntimeError("add_engine() needs a started client")
        if spec.name in self.engines:
            raise ValueError(f"engine {spec.name!r} already added")
        ctx = self._ctx
        handshake = ctx.socket(zmq.ROUTER)
        inp = ctx.socket(zmq.ROUTER)
        out = ctx.socket(zmq.PULL)
        # An engine restarting under the same identity replaces its stale handshake connection.
        # The input socket hands an identity over only between an answered HELLO and the ready
        # map (see _on_handshake): otherwise a stranger dialling in as b"\x00\x00" would take
        # the engine's place and receive its prompts; libzmq refuses it instead.
        handshake.setsockopt(zmq.ROUTER_HANDOVER, 1)
        inp.setsockopt(zmq.ROUTER_HANDOVER, 0)
        for sock, limit in ((handshake, CONTROL_MAX_MSG_SIZE), (inp, CONTROL_MAX_MSG_SIZE),
                            (out, self.max_msg_size)):
            sock.setsockopt(zmq.MAXMSGSIZE, limit)
            if self._auth is not None:
                # A NULL-mechanism socket consults the ZAP handler only with a domain set.
                sock.zap_domain = b"kvroute-engines"
        # Unroutable sends must fail loudly (EHOSTUNREACH), not vanish.
        inp.setsockopt(zmq.ROUTER_MANDATORY, 1)
        for sock in (inp, out):
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
        try:
            # An engine linked as a peer router's has no handshake here (another router owns
            # it): a private inproc address stands in, which nothing dials.
            handshake.bind(spec.handshake or f"inproc://kvroute-no-handshake-{id(handshake):x}")
            inp.bind(spec.input_address)
            out.bind(spec.output_address)
        except zmq.ZMQError as e:
            for sock in (handshake, inp, out):
                sock.close(linger=0)
            raise EngineUnavailableError(
                f"engine {spec.name!r}: cannot bind its sockets ({e}); is another router "
                "still running on these addresses?"
            ) from e
        eng = EngineState(spec, handshake, inp, out)
        self.engines[spec.name] = eng
        self._sync_inputs[eng] = zmq.Socket.shadow(inp.underlying)
        open_monitors(eng)
        eng.tasks = [
            asyncio.create_task(self._supervise(eng, "listen", self._listen),
                                name=f"listen-{spec.name}"),
            asyncio.create_task(self._supervise(eng, "control", self._control),
                                name=f"control-{spec.name}"),
            asyncio.create_task(self._supervise(eng, "connections", self._connections),
                                name=f"connections-{spec.name}"),
        ]
        return eng

    async def _supervise(
        self, eng: EngineState, what: str, run: Callable[[EngineState], Awaitable[None]]
    ) -> None:
        """Run one of the engine's tasks for the client's lifetime: a failure is logged at once,
        marks the engine dead (its streams end; it is probed and re-adopted if it answers) and
        restarts the task."""
        while True:
            try:
                await run(eng)
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:
                eng.counters.task_restarts += 1
                log.exception("engine %s: its %s task failed; restarting it", eng.spec.name, what)
                if eng.status is not EngineStatus.DEAD:
                    self._engine_died(eng, f"its {what} task failed ({e!r})", maybe_hung=True)
                else:
                    eng.maybe_hung = True
            await asyncio.sleep(RESTART_DELAY)

    async def remove_engine(self, name: str) -> None:
        """Stop linking to an engine: its requests fail, its sockets close (the engine itself
        keeps running and would be re-adopted by a client binding the same addresses)."""
        eng = self.engines.pop(name, None)
        if eng is None:
            return
        for task in eng.tasks:
            task.cancel()
        for task in eng.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        cut = list(eng.in_flight)
        self._fail_engine_requests(eng, EngineUnavailableError(f"engine {name!r} was removed"))
        if cut and eng.status is not EngineStatus.DEAD:
            # The engine goes on running: it must not generate on for streams that are gone.
            with contextlib.suppress(EngineLinkError):
                await self._send(eng, REQ_ABORT, self._encoder.encode(cut), grace=0.0)
        self._sync_inputs.pop(eng, None)
        close_monitors(eng)
        for sock in eng.sockets():
            # The abort gets a moment to leave; nothing else is waiting to.
            sock.close(linger=ABORT_LINGER_MS if cut and sock is eng.input else 0)

    async def wait_ready(self, timeout: float, engines: Sequence[str] | None = None) -> None:
        """Wait until the named (default: all) engines are handshaken or re-adopted."""
        names = list(self.engines) if engines is None else list(engines)
        waits = [self._engine(n).ready_event.wait() for n in names]
        try:
            async with asyncio.timeout(timeout):
                await asyncio.gather(*waits)
        except TimeoutError:
            missing = [n for n in names if not self.engines[n].ready_event.is_set()]
            hints = ", ".join(f"{n} at {self.engines[n].handshake_endpoint}" for n in missing)
            raise EngineUnavailableError(
                f"no engine connected within {timeout:.0f}s: {hints}. Start each with "
                "`vllm serve MODEL --headless --data-parallel-address HOST "
                "--data-parallel-rpc-port PORT` pointing at that address, or raise the timeout "
                "(model loading can take minutes)."
            ) from None

    async def wait_connects(self, engine: str, count: int, timeout: float) -> None:
        """Wait until the engine has connected ``count`` times in all (``counters.connects``):
        a restarted engine's new handshake, or a re-adoption."""
        eng = self._engine(engine)

        async def reached() -> None:
            while eng.counters.connects < count:
                eng.connect_event.clear()
                await eng.connect_event.wait()

        async with asyncio.timeout(timeout):
            await reached()

    # ---- requests ----

    async def submit(self, engine: str, request: EngineCoreRequest) -> RequestStream:
        """Send ADD; the returned stream yields this request's outputs until one finishes it."""
        eng = self._engine(engine)
        rid = request.request_id
        if rid in self._request_engine:
            raise ValueError(f"request id {rid!r} is already in flight")
        if eng.status is EngineStatus.DEAD:
            raise EngineDeadError(f"engine {engine!r} is dead: {eng.death_reason}")
        request.client_index = self.client_index
        stream = RequestStream(rid, engine)
        if not eng.in_flight:
            # Silence is only suspicious from the moment there is work to answer.
            eng.last_output = time.monotonic()
        eng.in_flight[rid] = stream
        self._request_engine[rid] = eng
        try:
            await self._send(eng, REQ_ADD, self._encoder.encode(request))
        except BaseException:
            eng.in_flight.pop(rid, None)
            self._request_engine.pop(rid, None)
            raise
        eng.counters.requests += 1
        return stream

    async def abort(self, request_ids: Iterable[str]) -> None:
        """Abort requests; their streams end with a FinishReason.ABORT output right away."""
        by_engine: dict[str, list[str]] = {}
        for rid in request_ids:
            eng = self._request_engine.pop(rid, None)
            if eng is None:
                continue
            stream = eng.in_flight.pop(rid, None)
            if stream is not None:
                # vLLM sends nothing for an aborted request: finishing it is the client's job.
                stream.finish(EngineCoreOutput(rid, [], finish_reason=FinishReason.ABORT))
            by_engine.setdefault(eng.spec.name, []).append(rid)
        for name, rids in by_engine.items():
            eng = self.engines[name]
            if eng.status is EngineStatus.DEAD:
                continue
            with contextlib.suppress(EngineLinkError):
                await self._send(eng, REQ_ABORT, self._encoder.encode(rids))

    async def call_utility(
        self, engine: str, method: str, *args: Any, timeout: float = 30.0
    ) -> Any:
        """Run ``EngineCore.<method>(*args)`` on the engine and return its (plain) result."""
        eng = self._engine(engine)
        if eng.status is EngineStatus.DEAD:
            raise EngineDeadError(f"engine {engine!r} is dead: {eng.death_reason}")
        async with asyncio.timeout(timeout):
            return await self._utility_call(eng, method, args)

    # ---- internals ----

    def _engine(self, name: str) -> EngineState:
        if self._phase is not _Phase.STARTED:
            raise EngineUnavailableError("engine client is not running")
        try:
            return self.engines[name]
        except KeyError:
            raise EngineUnavailableError(f"unknown engine {name!r}") from None

    async def _utility_call(
        self, eng: EngineState, method: str, args: tuple[Any, ...], grace: float | None = None
    ) -> Any:
        call_id = next(self._call_ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._utility[call_id] = (eng, fut)
        if not eng.in_flight:
            eng.last_output = time.monotonic()
        try:
            payload = self._encoder.encode((self.client_index, call_id, method, args))
            await self._send(eng, REQ_UTILITY, payload, grace)
            return await fut
        finally:
            self._utility.pop(call_id, None)

    async def _send(
        self, eng: EngineState, kind: bytes, payload: bytes, grace: float | None = None
    ) -> None:
        # A plain (shadow) socket with DONTWAIT: pyzmq's asyncio send wraps the same libzmq call
        # in a Future and enum flag arithmetic, and the input socket never blocks (no high-water
        # mark), so nothing is awaited on the hot path.
        sock = self._sync_inputs.get(eng)
        if sock is None:
            raise EngineUnavailableError(f"engine {eng.spec.name!r} was removed")
        send = sock.send
        deadline = 0.0
        while True:
            try:
                # Frame by frame with int flags: send_multipart type-checks every part and ORs
                # enum flags per frame (enum.__or__ in Python). A ROUTER sends all frames or none
                # (EHOSTUNREACH comes on the first), so a retry resends the whole message.
                send(eng.identity, _MORE)
                send(kind, _MORE)
                send(payload, _LAST)
                return
            except zmq.ZMQError as e:
                if e.errno not in (zmq.EHOSTUNREACH, zmq.EAGAIN):
                    raise EngineUnavailableError(f"engine {eng.spec.name!r}: {e}") from e
                now = time.monotonic()
                if not deadline:
                    deadline = now + (self.reconnect_grace if grace is None else grace)
                if now >= deadline:
                    raise EngineUnavailableError(
                        f"engine {eng.spec.name!r} is not connected to {eng.input_endpoint}"
                    ) from e
            # The engine's DEALER is reconnecting (router restart or engine restart): back off.
            await asyncio.sleep(0.01)

    async def _listen(self, eng: EngineState) -> None:
        """Outputs are read in the loop's reader callback, drained until EAGAIN: no Future and
        no task switch per message (pyzmq's asyncio recv costs both)."""
        sock: zmq.Socket[bytes] = zmq.Socket.shadow(eng.output.underlying)
        fd = sock.fileno()
        loop = asyncio.get_running_loop()
        recv = sock.recv
        # EVENTS and RCVMORE are int options (getsockopt is typed int | bytes for all).
        option = cast(Callable[[int], int], sock.getsockopt)

        def readable() -> None:
            # ZMQ_FD is edge-triggered: read everything queued, or the next edge never comes.
            # A wake nearly always brings a message, so the first recv is just tried (a wake
            # without one ends in zmq.Again, whose failed recv re-arms the edge); after it,
            # "queued" is asked (ZMQ_EVENTS, which re-arms the edge too) rather than found out
            # by another recv raising zmq.Again: pyzmq builds that exception in Python, dearer than
            # an EVENTS read. Frames are copied to bytes: below pyzmq's copy threshold
            # a Frame costs more than the copy, and outputs are a few hundred bytes.
            try:
                frames = [recv(_NOWAIT)]
            except zmq.Again:
                return
            while True:
                while option(_RCVMORE):
                    frames.append(recv(_NOWAIT))
                try:
                    self.on_output_frames(eng, frames)
                except Exception:
                    # A reader callback's exception would only reach the loop's handler; the
                    # message is dropped and counted, the next one is read.
                    eng.counters.decode_errors += 1
                    eng.dropped_event.set()
                    log.exception("engine %s: an output message failed", eng.spec.name)
                if not option(_EVENTS) & _POLLIN:
                    return
                frames = [recv(_NOWAIT)]

        loop.add_reader(fd, readable)
        try:
            readable()  # whatever arrived before the reader was registered
            await loop.create_future()  # runs until the client cancels this task
        finally:
            loop.remove_reader(fd)

    def on_output_frames(self, eng: EngineState, frames: Sequence[zmq.Frame | bytes]) -> None:
        """Decode one EngineCoreOutputs message and route it (the hot receive path)."""
        bufs = [f if isinstance(f, bytes) else f.buffer for f in frames]
        if len(bufs) == 1 and bufs[0] == ENGINE_CORE_DEAD:
            self._on_core_dead(eng)
            return
        try:
            outs = decode_engine_outputs(self._out_decoder, bufs)
        except (msgspec.DecodeError, ValueError, TypeError, IndexError, KeyError):
            eng.counters.decode_errors += 1
            eng.dropped_event.set()
            return
        eng.last_output = time.monotonic()
        eng.counters.messages += 1
        # Outputs never mark an engine ready: anyone who reaches the PULL can send them. A
        # reconnecting or hung engine is re-adopted by a probe on its input socket instead.
        stats = outs.scheduler_stats
        if stats and stats != NIL:
            eng.set_raw_stats(stats)
        streams = eng.in_flight
        for out in outs.outputs:
            stream = streams.get(out.request_id)
            if stream is None:
                # Late outputs of aborted or failed requests.
                eng.counters.stray_outputs += 1
                continue
            eng.counters.tokens += len(out.new_token_ids)
            if out.finish_reason is None:
                stream.push(out)
            else:
                del streams[out.request_id]
                self._request_engine.pop(out.request_id, None)
                stream.finish(out)
        if outs.finished_requests:
            for rid in outs.finished_requests:
                stream = streams.pop(rid, None)
                if stream is not None:
                    self._request_engine.pop(rid, None)
                    stream.finish(EngineCoreOutput(rid, [], finish_reason=FinishReason.ABORT))
        if outs.utility_output is not None:
            self._on_utility(outs.utility_output.call_id, outs.utility_output)

    def _on_core_dead(self, eng: EngineState) -> None:
        """A PULL cannot tell its senders apart: ENGINE_CORE_DEAD is believed only if the engine
        no longer answers a utility call on its input socket (where only it is routed)."""
        if eng.status is EngineStatus.DEAD or eng.verifying_death:
            return
        if eng.status is not EngineStatus.READY:
            self._engine_died(eng, "the engine sent ENGINE_CORE_DEAD")
            return
        eng.verifying_death = True
        eng.tasks.append(asyncio.create_task(self._verify_death(eng),
                                             name=f"verify-{eng.spec.name}"))

    async def _verify_death(self, eng: EngineState) -> None:
        try:
            if await self._answers(eng):
                eng.counters.forged_deaths += 1
                eng.dropped_event.set()
                log.warning("engine %s: ENGINE_CORE_DEAD from a peer while the engine answers; "
                            "ignored", eng.spec.name)
            elif eng.status is not EngineStatus.DEAD:
                self._engine_died(eng, "the engine sent ENGINE_CORE_DEAD")
        finally:
            eng.verifying_death = False
            current = asyncio.current_task()
            eng.tasks[:] = [t for t in eng.tasks if t is not current]

    async def _answers(self, eng: EngineState) -> bool:
        """Does the linked engine answer a cheap utility call within VERIFY_TIMEOUT?"""
        try:
            async with asyncio.timeout(VERIFY_TIMEOUT):
                await self._utility_call(eng, PROBE_METHOD, (), grace=0.0)
        except (EngineLinkError, UtilityCallError, TimeoutError):
            return False
        return True

    def _on_utility(self, call_id: int, result: Any) -> None:
        entry = self._utility.get(call_id)
        if entry is None or entry[1].done():
            return
        eng, fut = entry
        if result.failure_message is not None:
            fut.set_exception(UtilityCallError(result.failure_message))
            return
        value = result.result
        # vLLM sends [type_info, value]; type_info is None for plain msgpack results.
        if isinstance(value, list) and len(value) == 2:
            value = value[1]
        fut.set_result(value)

    async def _control(self, eng: EngineState) -> None:
        """Handshake and ready map for fresh engines; probes for engines that reconnect."""
        poller = zmq.asyncio.Poller()
        poller.register(eng.handshake, zmq.POLLIN)
        poller.register(eng.input, zmq.POLLIN)
        probe: asyncio.Task[Any] | None = None
        wait_ms = int(self.probe_interval * 1000)
        try:
            while True:
                events = dict(await poller.poll(timeout=wait_ms))
                if eng.input in events:
                    await self._recv_ready_response(eng)
                if eng.handshake in events:
                    frames = await eng.handshake.recv_multipart()
                    if len(frames) == 2:
                        await self._on_handshake(eng, frames[0], frames[1])
                    else:
                        eng.counters.malformed_frames += 1
                        eng.dropped_event.set()
                # Probe engines we have no live link to: one reconnecting after a router restart,
                # or one declared dead that may only have hung.
                idle = probe is None or probe.done()
                lost = eng.status is EngineStatus.CONNECTING or (
                    eng.status is EngineStatus.DEAD and eng.maybe_hung
                )
                if idle and lost:
                    probe = asyncio.create_task(self._probe(eng))
                if idle_due(eng, time.monotonic(), self.idle_probe_after, self._busy(eng)):
                    self._spawn_check(eng, idle=True)
                wait_ms = int(self.probe_interval * 1000) if lost else LINKED_POLL_MS
        finally:
            if probe is not None:
                probe.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await probe

    async def _recv_ready_response(self, eng: EngineState) -> None:
        """The engine sends one message on its input socket: the ready map, after a HELLO was
        answered and before READY. Anything else there is a stranger's, dropped and counted."""
        frames = await eng.input.recv_multipart()
        if len(frames) != 2:
            eng.counters.malformed_frames += 1
            eng.dropped_event.set()
            return
        ident, payload = frames
        if (self.client_index and eng.status is EngineStatus.CONNECTING
                and not eng.spec.handshake and ident == eng.identity):
            # A peer router's engine sends its ready map to every frontend it was given; this
            # router took no part in that handshake and adopts the engine by probe instead.
            log.debug("engine %s: ready map as a peer router, ignored", eng.spec.name)
            return
        if eng.status is not EngineStatus.HANDSHAKING or eng.ready is not None:
            self._refuse_input(eng, ident)
            return
        try:
            ready = self._ready_decoder.decode(payload)
        except msgspec.DecodeError:
            eng.counters.decode_errors += 1
            eng.dropped_event.set()
            return
        # vLLM names an engine's DEALER by its data-parallel rank.
        rank = ready.data_parallel_rank
        if not 0 <= rank < 1 << 16 or ident != rank.to_bytes(2, "little"):
            self._refuse_input(eng, ident)
            return
        eng.ready = ready
        eng.identity = ident
        # The engine's DEALER holds the identity now: no one may take it over.
        eng.input.setsockopt(zmq.ROUTER_HANDOVER, 0)

    def _refuse_input(self, eng: EngineState, ident: bytes) -> None:
        eng.counters.refused_identities += 1
        eng.dropped_event.set()
        log.warning("engine %s: refused a message on its input socket from identity %r",
                    eng.spec.name, ident[:16])

    async def _probe(self, eng: EngineState) -> None:
        # An engine that outlived a router restart reconnects its DEALER and PUSH to our
        # addresses but never handshakes again: a utility call that routes proves it is there.
        with contextlib.suppress(EngineLinkError, TimeoutError):
            # One send attempt per probe interval: an absent engine costs ~nothing.
            async with asyncio.timeout(5.0):
                await self._utility_call(eng, PROBE_METHOD, (), grace=0.0)
            if eng.status is not EngineStatus.READY:
                self._mark_ready(eng, adopted=eng.status is EngineStatus.CONNECTING)

    async def _on_handshake(self, eng: EngineState, ident: bytes, payload: bytes) -> None:
        try:
            status = self._status_decoder.decode(payload)
        except msgspec.DecodeError:
            eng.counters.decode_errors += 1
            eng.dropped_event.set()
            return
        if status.status == "HELLO":
            if eng.status is EngineStatus.READY and await self._answers(eng):
                # The linked engine still answers: this HELLO is not from a restarted process.
                eng.counters.refused_handshakes += 1
                eng.dropped_event.set()
                log.warning("engine %s: refused a HELLO while the engine is linked and answers",
                            eng.spec.name)
                return
            if eng.in_flight or eng.status is EngineStatus.READY:
                # A new engine process under this name: whatever the old one held is lost.
                self._engine_died(eng, "the engine restarted (new handshake)")
            eng.status = EngineStatus.HANDSHAKING
            eng.hello_identity = ident
            eng.adopted = False
            eng.ready = None
            eng.ready_event.clear()
            # The new process's DEALER replaces the old one's connection, if that lingers.
            eng.input.setsockopt(zmq.ROUTER_HANDOVER, 1)
            # This router's sockets first (client index 0), then the peer routers' (vLLM's
            # multi-frontend lists): the engine connects to every one of them.
            meta = EngineHandshakeMetadata(EngineZmqAddresses(
                inputs=[eng.input_endpoint, *eng.spec.peer_inputs],
                outputs=[eng.output_endpoint, *eng.spec.peer_outputs]))
            await eng.handshake.send_multipart((ident, msgspec.msgpack.encode(meta)))
        elif status.status == "READY":
            if eng.status is not EngineStatus.HANDSHAKING or ident != eng.hello_identity:
                eng.counters.refused_handshakes += 1
                eng.dropped_event.set()
                log.warning("engine %s: refused a READY outside its handshake", eng.spec.name)
                return
            # The ready map left on the input socket before READY, but the two sockets do not
            # order against each other: READY may overtake it.
            if eng.ready is None and await eng.input.poll(READY_MAP_WAIT_MS):
                await self._recv_ready_response(eng)
            eng.input.setsockopt(zmq.ROUTER_HANDOVER, 0)
            self._mark_ready(eng, adopted=False)
        else:
            eng.counters.refused_handshakes += 1
            eng.dropped_event.set()

    async def _connections(self, eng: EngineState) -> None:
        async def dropped(eng: EngineState) -> None:
            self._spawn_check(eng, idle=False)

        await watch_connections(eng, dropped)

    def _busy(self, eng: EngineState) -> bool:
        return bool(eng.in_flight) or any(o is eng for o, _ in self._utility.values())

    def _spawn_check(self, eng: EngineState, *, idle: bool) -> None:
        if eng.checking or eng.status is not EngineStatus.READY:
            return
        eng.checking = True
        eng.counters.health_probes += 1
        eng.tasks.append(asyncio.create_task(self._check_alive(eng, idle),
                                             name=f"check-{eng.spec.name}"))

    async def _check_alive(self, eng: EngineState, idle: bool) -> None:
        """A probe after a dropped connection (``idle``: after a quiet spell without work): the
        engine is dead if its input no longer routes the call, or, idle, if it stays
        unanswered past VERIFY_TIMEOUT (a busy engine's slow answer is the watchdog's case).

        libzmq reports a dropped connection before its socket has let go of the peer, so a
        first call may still route (into a pipe being torn down): unanswered, the call is sent
        again after 50, 100, 200 ... ms until one is answered or cannot be routed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + VERIFY_TIMEOUT
        delay = 0.05
        calls: set[asyncio.Future[Any]] = set()
        try:
            while eng.status is EngineStatus.READY:
                calls.add(asyncio.ensure_future(
                    self._utility_call(eng, PROBE_METHOD, (), grace=0.0)))
                left = deadline - loop.time()
                done, calls = await asyncio.wait(calls, timeout=max(min(delay, left), 0.0),
                                                 return_when=asyncio.FIRST_COMPLETED)
                failures = [call.exception() for call in done]
                if any(e is None or isinstance(e, UtilityCallError) for e in failures):
                    return  # answered: it is there
                if any(isinstance(e, EngineLinkError) for e in failures):
                    if eng.status is EngineStatus.READY:
                        self._engine_died(eng, "its connection dropped", maybe_hung=True)
                    return
                if loop.time() >= deadline:
                    if idle and eng.status is EngineStatus.READY and not eng.in_flight:
                        self._engine_died(eng, f"no answer to a probe in {VERIFY_TIMEOUT:g}s "
                                          "while idle", maybe_hung=True)
                    return
                delay *= 2
        finally:
            for call in calls:
                call.cancel()
            eng.checking = False
            current = asyncio.current_task()
            eng.tasks[:] = [t for t in eng.tasks if t is not current]

    def _mark_ready(self, eng: EngineState, *, adopted: bool) -> None:
        eng.clear_stats()  # its load is what it reports from now on
        eng.status = EngineStatus.READY
        eng.adopted = adopted or eng.adopted
        eng.death_reason = None
        eng.last_output = time.monotonic()
        eng.counters.connects += 1
        eng.ready_event.set()
        eng.connect_event.set()

    def _engine_died(self, eng: EngineState, reason: str, *, maybe_hung: bool = False) -> None:
        eng.clear_stats()
        eng.status = EngineStatus.DEAD
        eng.death_reason = reason
        eng.maybe_hung = maybe_hung
        eng.ready_event.clear()
        eng.counters.deaths += 1
        self._fail_engine_requests(eng, EngineDeadError(f"engine {eng.spec.name!r}: {reason}"))

    def _fail_engine_requests(self, eng: EngineState, exc: EngineLinkError) -> None:
        for rid, stream in eng.in_flight.items():
            self._request_engine.pop(rid, None)
            stream.fail(exc)
        eng.in_flight.clear()
        for call_id, (owner, fut) in list(self._utility.items()):
            if owner is eng and not fut.done():
                fut.set_exception(exc)
                del self._utility[call_id]

    async def _watchdog(self) -> None:
        period = max(self.dead_after / 4, 0.01)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for eng in list(self.engines.values()):
                if (
                    self._busy(eng)
                    and eng.status is EngineStatus.READY
                    and now - eng.last_output > self.dead_after
                ):
                    orphans = list(eng.in_flight)
                    why = f"no output for {self.dead_after:g}s with work in flight"
                    self._engine_died(eng, why, maybe_hung=True)
                    # A hung engine may wake up: do not let it keep generating for nobody.
                    if orphans:
                        with contextlib.suppress(EngineLinkError):
                            await self._send(eng, REQ_ABORT, self._encoder.encode(orphans), 0.0)
