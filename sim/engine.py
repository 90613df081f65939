"""SimEngine: one simulated vLLM EngineCore process (or thread) speaking the real ZMQ protocol.

The busy loop mirrors ``EngineCoreProc.run_busy_loop``: between steps it takes requests from the
input sockets (ADD, ABORT, UTILITY; EXECUTOR_FAILED kills it), a step is planned, lasts its
simulated duration while inputs keep arriving, then completes: outputs go to each client's PUSH
socket as ``[msgpack(EngineCoreOutputs), *aux ndarray frames]`` and the step's KV events are
published. A fatal error sends ``ENGINE_CORE_DEAD`` on every output socket, as vLLM does; a plain
stop (``stop()``, SIGTERM) sends nothing. zmq reconnects to a frontend that comes back at the
same addresses, so no new handshake is needed; one that stays away ``frontend_gone_timeout``
seconds ends the loop (the engine exits rather than wait forever for a router that is gone).
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from sim.config import SimConfig
from sim.histogram import LATENCY_BUCKETS, TTFT_BUCKETS, Histogram
from sim.kv_publisher import KVEventPublisher
from sim.lora import NOT_ENABLED, LoRAError, worker_failure
from sim.protocol import (
    EngineSockets,
    complete_handshake,
    connect_handshake,
    connect_io,
    drain_signal_fd,
    receive_addresses,
)
from sim.request import SimRequest
from sim.scheduler import Scheduler, StepPlan
from sim.tokens import markov_key, request_key
from wire.engine import (
    ENGINE_CORE_DEAD,
    REQ_ABORT,
    REQ_ADD,
    REQ_EXECUTOR_FAILED,
    REQ_START_DP_WAVE,
    REQ_UTILITY,
    REQ_WAKEUP,
    EngineCoreEvent,
    EngineCoreEventType,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineError,
    FinishReason,
    LoRARequest,
    UtilityOutput,
    enc_hook,
    ext_hook,
)
from wire.ndarrays import Buffer, encode_ndarray

log = logging.getLogger(__name__)

# Bound the input drained between two step checks, so a flood of requests cannot stall a step.
_MAX_DRAIN = 4096
LORA_UTILITIES = frozenset({"add_lora", "remove_lora", "pin_lora", "list_loras"})
# The client_index of requests from the engine's own HTTP face (sim/http/): its outputs go to
# the face's inproc socket, not to a handshaken frontend's.
FACE_CLIENT = 0xFFFF


@dataclass
class EngineTotals:
    """What the HTTP face's /metrics reports, kept by the engine thread after every step
    (plain numbers: the face's thread reads them as they are)."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_queries: int = 0
    prefix_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    # From the engine's QUEUED / SCHEDULED stamps: waiting before the first schedule, and the
    # time to the first token as the engine sees it (from its receipt of the request).
    queue_time: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))


class OutputEncoder:
    """vLLM's MsgpackEncoder for outputs: ndarrays inline under 256 bytes, else as aux frames."""

    def __init__(self) -> None:
        self._aux: list[Buffer] | None = None
        self._encoder = msgspec.msgpack.Encoder(enc_hook=self._hook)

    def _hook(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray) and self._aux is not None:
            return encode_ndarray(obj, self._aux)
        return enc_hook(obj)

    def encode(self, obj: Any) -> list[Buffer]:
        aux: list[Buffer] = [b""]
        self._aux = aux
        try:
            aux[0] = self._encoder.encode(obj)
        finally:
            self._aux = None
        return aux


class SimEngine:
    """Run with ``run()`` (blocking: handshake, then serve until ``stop()``)."""

    def __init__(self, config: SimConfig, signal_fd: socket.socket | None = None) -> None:
        self.config = config
        # The process's signal wakeup socket (set by ``kvroute sim-engine``), polled beside the
        # wake socket: a signal taken by another thread must still end a blocking poll.
        self._signal_fd = signal_fd
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.scheduler = Scheduler(config)
        self.kv_publisher: KVEventPublisher | None = None
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        wake = f"inproc://sim-engine-wake-{id(self):x}"
        self._wake_rx = self._ctx.socket(zmq.PAIR)
        self._wake_rx.bind(wake)
        self._wake_tx = self._ctx.socket(zmq.PAIR)
        self._wake_tx.connect(wake)
        self._stop_lock = threading.Lock()
        self.totals = EngineTotals()
        # The HTTP face's two inproc sockets (it connects its own to these addresses).
        self.face_input = f"inproc://sim-face-in-{id(self):x}"
        self.face_output = f"inproc://sim-face-out-{id(self):x}"
        # Run first when the engine closes, while its context still lives (the HTTP face
        # stops its server and closes its sockets of this context there).
        self.on_close: list[Callable[[], None]] = []
        self._face_in: zmq.Socket[bytes] | None = None
        self._face_out: zmq.Socket[bytes] | None = None
        if config.http is not None:
            self._face_in = self._ctx.socket(zmq.PULL)
            self._face_out = self._ctx.socket(zmq.PUSH)
            for sock, address in ((self._face_in, self.face_input),
                                  (self._face_out, self.face_output)):
                sock.setsockopt(zmq.SNDHWM, 0)
                sock.setsockopt(zmq.RCVHWM, 0)
                sock.setsockopt(zmq.LINGER, 0)
                sock.bind(address)
        self._stopped = False
        self._monitor: zmq.Socket[bytes] | None = None
        self._req_decoder = msgspec.msgpack.Decoder(EngineCoreRequest, ext_hook=ext_hook)
        self._decoder = msgspec.msgpack.Decoder(ext_hook=ext_hook)
        self._encoder = OutputEncoder()

    @property
    def context(self) -> zmq.Context[zmq.Socket[bytes]]:
        """The engine's ZMQ context (its HTTP face's inproc sockets must share it)."""
        return self._ctx

    def release(self) -> None:
        """Close every socket of the engine's context if ``run`` did not (it was never entered,
        or a signal interrupted it before its cleanup); idempotent."""
        if not self._ctx.closed:
            self._ctx.destroy(linger=0)

    def stop_from_signal(self) -> None:
        """``stop`` for a signal handler on the engine's own thread: it never waits for the lock,
        which that thread may hold while it closes (then it is stopping anyway)."""
        if self._stop_lock.acquire(blocking=False):
            try:
                if not self._stopped:
                    self._stopped = True
                    self._wake_tx.send(b"")
            finally:
                self._stop_lock.release()

    def stop(self) -> None:
        """Ask the loop to exit (thread-safe, idempotent); no ENGINE_CORE_DEAD is sent."""
        with self._stop_lock:
            if not self._stopped:
                self._stopped = True
                self._wake_tx.send(b"")

    def run(self) -> None:
        io: EngineSockets | None = None
        try:
            if self.config.handshake_address is None:
                self._start_kv_publisher()  # behind the HTTP face only: no frontend to wait for
                io = EngineSockets([], [])
            else:
                io = self._handshake()
                if io is None:
                    return
            self.ready.set()
            log.info(
                "ready: rank %d serving the frontend at %s (max_model_len "
                "%d, %d blocks of %d, output %s%s)",
                self.config.data_parallel_rank, self.config.handshake_address,
                self.config.max_model_len, self.config.num_gpu_blocks, self.config.block_size,
                "random" if self.config.output == "echo" and self.config.tokens.tokenizer is None
                else self.config.output,
                f", KV events on {self.kv_publisher.config.endpoint}" if self.kv_publisher else "",
            )
            try:
                self._serve(io)
            except Exception as e:
                log.exception("sim engine %d died", self.config.data_parallel_rank)
                self.error = e
                for s in io.outputs:
                    s.send(ENGINE_CORE_DEAD)
                raise
        except Exception as e:  # before serving (e.g. a KV endpoint already in use)
            if self.error is None:
                log.error("sim engine %d failed to start: %s", self.config.data_parallel_rank, e)
                self.error = e
            raise
        finally:
            self._close(io)

    def _start_kv_publisher(self) -> None:
        kv = self.config.kv_events
        if kv.enable_kv_cache_events and kv.publisher == "zmq":
            self.kv_publisher = KVEventPublisher(self._ctx, kv, self.config.data_parallel_rank)

    def _handshake(self) -> EngineSockets | None:
        """vLLM's headless handshake with the frontend; None if stopped while waiting."""
        assert self.config.handshake_address is not None
        hs = connect_handshake(self._ctx, self.config)
        try:
            addresses = receive_addresses(
                hs, self.config.handshake_timeout, self._wake_rx, self._signal_fd)
            if addresses is None:
                return None
            self._start_kv_publisher()
            io = connect_io(self._ctx, self.config, addresses)
            complete_handshake(
                hs, io, self.config, self.kv_publisher.config if self.kv_publisher else None
            )
            return io
        finally:
            hs.close(linger=0)

    def _close(self, io: EngineSockets | None) -> None:
        for callback in self.on_close:
            try:
                callback()
            except Exception:
                log.exception("a close callback failed")
        if self._monitor is not None:
            assert io is not None
            io.inputs[0].disable_monitor()
            self._monitor.close(linger=0)
        if io is not None:
            for s in io.inputs:
                s.close(linger=0)
            for s in io.outputs:
                # After a death the socket's 4 s linger lets ENGINE_CORE_DEAD reach a live peer;
                # a clean stop must not hang on a frontend that is already gone.
                s.close(linger=None if self.error is not None else 200)
        if self.kv_publisher is not None:
            self.kv_publisher.close()
        for sock in (self._face_in, self._face_out):
            if sock is not None:
                sock.close(linger=0)
        self._wake_rx.close(linger=0)
        with self._stop_lock:
            self._stopped = True
            self._wake_tx.close(linger=0)
        # destroy, not term: a socket left open by a failed start must not hang the exit.
        self._ctx.destroy(linger=0)

    # ---- the busy loop ----

    def _serve(self, io: EngineSockets) -> None:
        poller = zmq.Poller()
        for s in io.inputs:
            poller.register(s, zmq.POLLIN)
        poller.register(self._wake_rx, zmq.POLLIN)
        signal_fd = self._signal_fd.fileno() if self._signal_fd is not None else None
        if self._signal_fd is not None:
            poller.register(self._signal_fd, zmq.POLLIN)
        if self._face_in is not None:
            poller.register(self._face_in, zmq.POLLIN)
        replay = self.kv_publisher.replay if self.kv_publisher else None
        if replay is not None:
            poller.register(replay, zmq.POLLIN)
        gone_after = self.config.frontend_gone_timeout
        if gone_after > 0 and io.inputs:
            # The frontend's sockets are bound, ours connect: a disconnect that lasts means it
            # has gone (a restarted frontend reconnects within the timeout and is served on).
            self._monitor = io.inputs[0].get_monitor_socket(
                zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
            poller.register(self._monitor, zmq.POLLIN)
        gone_since: float | None = None
        sched = self.scheduler
        plan: StepPlan | None = None
        deadline = 0.0
        while True:
            if plan is None and sched.has_work():
                now = time.monotonic()
                plan = sched.schedule(now)
                deadline = now + plan.duration
            wake_at = deadline if plan is not None else None
            if gone_since is not None:
                gone_at = gone_since + gone_after
                wake_at = gone_at if wake_at is None else min(wake_at, gone_at)
            timeout = (
                None if wake_at is None else math.ceil(max(0.0, wake_at - time.monotonic()) * 1e3)
            )
            for sock, _ in poller.poll(timeout):
                if sock is self._wake_rx:
                    return
                if sock == signal_fd:
                    assert self._signal_fd is not None
                    drain_signal_fd(self._signal_fd)  # the handler has run: wake_rx is next
                    continue
                if sock is self._monitor:
                    gone_since = self._frontend_events(gone_since)
                elif sock is replay:
                    assert self.kv_publisher is not None
                    self.kv_publisher.service_replay()
                else:
                    self._drain(sock, io)
            if gone_since is not None and time.monotonic() >= gone_since + gone_after:
                log.warning("sim engine %d: the frontend at %s has been gone for %g s; exiting",
                            self.config.data_parallel_rank, self.config.handshake_address,
                            gone_after)
                return
            if plan is not None and time.monotonic() >= deadline:
                outputs = sched.finish(plan)
                plan = None
                self._account(outputs)
                events = sched.pool.take_events()
                if events and self.kv_publisher is not None:
                    self.kv_publisher.publish(events)
                for client, out in outputs.items():
                    self._send(io, client, out)

    def _frontend_events(self, gone_since: float | None) -> float | None:
        """Reads the input socket's connect/disconnect events: since when the frontend is gone,
        or None while it is connected."""
        assert self._monitor is not None
        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)["event"]
            if event == zmq.EVENT_DISCONNECTED:
                gone_since = gone_since if gone_since is not None else time.monotonic()
            elif event == zmq.EVENT_CONNECTED:
                gone_since = None
        return gone_since

    def _account(self, outputs: dict[int, EngineCoreOutputs]) -> None:
        totals, sched = self.totals, self.scheduler
        totals.running, totals.waiting = len(sched.running), len(sched.waiting)
        totals.kv_cache_usage = sched.pool.usage
        for out in outputs.values():
            for o in out.outputs:
                totals.generation_tokens += len(o.new_token_ids)
                if o.prefill_stats is not None:
                    totals.prompt_tokens += int(o.prefill_stats.get("num_prompt_tokens", 0))
                if o.events:
                    self._account_first(o.events, out.timestamp)
            stats = out.scheduler_stats
            prefix = stats.get("prefix_cache_stats") if isinstance(stats, dict) else None
            if isinstance(prefix, dict):
                totals.prefix_queries += int(prefix.get("queries", 0))
                totals.prefix_hits += int(prefix.get("hits", 0))

    def _account_first(self, events: list[EngineCoreEvent], produced: float) -> None:
        """A request's first output carries its QUEUED and first SCHEDULED stamps."""
        queued = next((e.timestamp for e in events if e.type == EngineCoreEventType.QUEUED), None)
        if queued is None:
            return  # a resumed request's later events
        scheduled = next(
            (e.timestamp for e in events if e.type == EngineCoreEventType.SCHEDULED), queued)
        self.totals.queue_time.observe(scheduled - queued)
        self.totals.ttft.observe(produced - queued)

    def _send(self, io: EngineSockets, client: int, outputs: EngineCoreOutputs) -> None:
        outputs.engine_index = self.config.data_parallel_rank
        if outputs.timestamp == 0.0:  # as vLLM's EngineCoreOutputs.__post_init__
            outputs.timestamp = time.monotonic()
        if client == FACE_CLIENT and self._face_out is not None:
            self._face_out.send_multipart(self._encoder.encode(outputs), copy=False)
            return
        if not 0 <= client < len(io.outputs):
            if outputs.outputs or outputs.utility_output is not None:
                log.warning("dropping outputs for unknown client_index %d", client)
            return  # a step's stats for a frontend that is not there (an HTTP-only engine)
        io.outputs[client].send_multipart(self._encoder.encode(outputs), copy=False)

    def _drain(self, sock: zmq.Socket[bytes], io: EngineSockets) -> None:
        for _ in range(_MAX_DRAIN):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._handle(frames, io)

    def _handle(self, frames: list[bytes], io: EngineSockets) -> None:
        kind, data = frames[0], frames[1:]
        if kind == REQ_EXECUTOR_FAILED:
            raise RuntimeError("Executor failed.")
        if kind in (REQ_START_DP_WAVE, REQ_WAKEUP):
            return
        # A malformed message is the sender's bug: log it and keep serving everyone else.
        try:
            if kind == REQ_ADD:
                req = self._req_decoder.decode(data[0])
            elif kind in (REQ_ABORT, REQ_UTILITY):
                body = self._decoder.decode(data[0])
                if kind == REQ_ABORT:
                    ids = [str(i) for i in body]
                else:
                    client, call_id, method, args = body
                    client, call_id, method = int(client), int(call_id), str(method)
            else:
                log.error("unrecognized input request type %r", kind)
                return
        except (
            msgspec.DecodeError,
            msgspec.ValidationError,
            IndexError,
            TypeError,
            ValueError,
        ) as e:
            log.error("dropping malformed %r message: %s", kind, e)
            return
        if kind == REQ_ADD:
            self._add(req, io)
        elif kind == REQ_ABORT:
            self.scheduler.abort(ids)
        else:
            out = EngineCoreOutputs(utility_output=self._utility(call_id, method, args))
            self._send(io, client, out)

    def _add(self, req: EngineCoreRequest, io: EngineSockets) -> None:
        cfg = self.config
        problem = self._reject_reason(req)
        if problem is not None:
            log.warning("rejecting request %s: %s", req.request_id, problem)
            error = EngineCoreOutput(
                request_id=req.request_id,
                new_token_ids=[],
                finish_reason=FinishReason.ERROR,
                error=EngineError(code=400, message=problem),
            )
            self._send(
                io, req.client_index, EngineCoreOutputs(outputs=[error], timestamp=time.monotonic())
            )
            return
        assert req.prompt_token_ids is not None and req.sampling_params is not None
        key = request_key(cfg.seed, req.request_id, req.prompt_token_ids, req.sampling_params)
        sim_req = SimRequest(req, key, cfg.max_model_len)
        if cfg.output == "echo":
            sample = None if req.sampling_params.temperature == 0.0 else key
            sim_req.echo, sim_req.echo_loop = cfg.tokens.echo_ids(req.prompt_token_ids, sample)
        elif cfg.output == "markov":
            sim_req.markov = markov_key(cfg.seed, req.request_id, req.sampling_params)
        self.scheduler.add(sim_req, time.monotonic())

    def _reject_reason(self, req: EngineCoreRequest) -> str | None:
        cfg = self.config
        if req.sampling_params is None:
            return "pooling requests are not supported by the sim engine"
        prompt = req.prompt_token_ids
        if not prompt:
            return "the sim engine needs a non-empty prompt_token_ids"
        if req.request_id in self.scheduler.requests:
            return f"request id {req.request_id!r} is already running"
        if len(prompt) >= cfg.max_model_len:
            # At least one output token must fit.
            return f"prompt has {len(prompt)} tokens, max_model_len is {cfg.max_model_len}"
        vocab = cfg.tokens.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            return f"prompt token ids must lie in [0, {vocab})"
        if not 0 <= req.client_index < 1 << 16:
            return "bad client_index"
        return None

    def _utility(self, call_id: int, method: str, args: Any) -> UtilityOutput:
        if method == "reset_prefix_cache":
            value: Any = self.scheduler.reset_prefix_cache(bool(args[0]) if args else False)
        elif method == "is_sleeping":
            value = False
        elif method in LORA_UTILITIES:
            try:
                value = self._lora_utility(method, list(args))
            except (LoRAError, ValueError, TypeError) as e:  # msgspec's errors are ValueErrors
                return UtilityOutput(call_id,
                                     failure_message=f"Call to {method} method failed: {e}")
        else:
            # What vLLM answers when getattr(engine_core, method) fails.
            msg = f"'EngineCoreProc' object has no attribute '{method}'"
            return UtilityOutput(call_id, failure_message=f"Call to {method} method failed: {msg}")
        # vLLM's UtilityResult without pickle support: [type_info=None, value].
        return UtilityOutput(call_id, result=[None, value])

    def _lora_utility(self, method: str, args: list[Any]) -> Any:
        """vLLM's add_lora(lora_request), remove_lora(id), pin_lora(id), list_loras(): the
        executor's checks first, then the worker's (whose failures it wraps)."""
        if method == "list_loras":
            if args:
                raise TypeError(f"list_loras() takes no arguments ({len(args)} given)")
        elif len(args) != 1:
            raise TypeError(f"{method}() takes exactly one argument ({len(args)} given)")
        if method == "add_lora":
            lora = msgspec.convert(args[0], LoRARequest)
            if lora.lora_int_id < 1:
                raise ValueError(f"id must be > 0, got {lora.lora_int_id}")
            if not lora.lora_path:
                raise ValueError("lora_path cannot be empty")
        elif method != "list_loras":
            lora_id = args[0]
            if not isinstance(lora_id, int) or lora_id < 1:
                raise ValueError("lora_id must be greater than 0.")
        cache = self.scheduler.loras
        try:
            if cache is None:
                raise LoRAError(NOT_ENABLED)
            if method == "add_lora":
                return cache.add(lora)
            if method == "remove_lora":
                return cache.remove(lora_id)
            if method == "pin_lora":
                return cache.pin(lora_id)
            return cache.ids()
        except LoRAError as e:
            raise LoRAError(worker_failure(str(e))) from None
