"""Strangers on an engine's sockets: a peer that is not the engine (the attacker, a plain ZMQ
socket here) changes nothing for the real engine (a simulated engine process) and is counted."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import msgspec
import pytest
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from router.config import EngineSpec
from router.front.app import _engine_snapshot
from router.kvfeed.kv_endpoints import KVEndpoints
from router.kvfeed.kv_subscriber import KVSubscriber
from router.link.engine_client import (
    CONTROL_MAX_MSG_SIZE,
    DEFAULT_MAX_MSG_SIZE,
    EngineClient,
    EngineStatus,
)
from router.link.engine_state import MAX_QUEUE_COUNT, EngineState, LinkCounters
from tests.engines import EngineProc, NaiveIndex, make_engine
from tests.test_engine_client import make_request, random_prompt, tokens
from tests.test_kv_subscriber import BS, batch, stored
from wire.engine import ENGINE_CORE_DEAD, EngineCoreOutputs, FinishReason

SIM_FLAGS = {"step_time": "0.01", "block_size": "16"}
WAIT = 30.0


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[EngineProc]:
    engine = make_engine("sim", "s0", tmp_path, **SIM_FLAGS)
    yield engine
    engine.kill()


@pytest.fixture
async def linked(sim: EngineProc) -> AsyncIterator[EngineClient]:
    async with EngineClient([sim.spec], dead_after=60.0) as client:
        sim.spawn()
        await client.wait_ready(60.0)
        yield client


class Strangers:
    """The attacker's sockets, closed at teardown."""

    def __init__(self) -> None:
        self.context = zmq.asyncio.Context()
        self.opened: list[zmq.asyncio.Socket] = []

    def socket(self, kind: int) -> zmq.asyncio.Socket:
        sock = self.context.socket(kind)
        self.opened.append(sock)
        return sock

    def monitor(self, sock: zmq.asyncio.Socket, events: int) -> zmq.asyncio.Socket:
        mon = sock.get_monitor_socket(events)
        self.opened.append(mon)
        return mon

    def close(self) -> None:
        for sock in reversed(self.opened):
            sock.close(linger=0)
        self.context.term()


@pytest.fixture
def ctx() -> Iterator[Strangers]:
    strangers = Strangers()
    yield strangers
    strangers.close()


async def dropped(eng: EngineState, done: Callable[[LinkCounters], bool]) -> None:
    """Wait until the engine's drop counters satisfy ``done`` (each drop sets the event)."""

    async def reached() -> None:
        while not done(eng.counters):
            eng.dropped_event.clear()
            await eng.dropped_event.wait()

    await asyncio.wait_for(reached(), WAIT)


def test_message_size_limits() -> None:
    # A 512 MiB frame is above every engine-socket limit (libzmq drops its sender).
    assert DEFAULT_MAX_MSG_SIZE < 512 * 1024 * 1024
    assert CONTROL_MAX_MSG_SIZE < DEFAULT_MAX_MSG_SIZE


async def test_oversized_frame_is_refused(sim: EngineProc, ctx: Strangers) -> None:
    limit = 1024 * 1024
    async with EngineClient([sim.spec], dead_after=60.0, max_msg_size=limit) as client:
        sim.spawn()
        await client.wait_ready(60.0)
        eng = client.engines[sim.name]
        assert eng.output.getsockopt(zmq.MAXMSGSIZE) == limit
        assert eng.input.getsockopt(zmq.MAXMSGSIZE) == CONTROL_MAX_MSG_SIZE
        stream = await client.submit(sim.name, make_request(random_prompt(16), 200))
        await anext(stream)
        push = ctx.socket(zmq.PUSH)
        monitor = ctx.monitor(push, zmq.EVENT_DISCONNECTED)
        push.connect(sim.spec.output_address)
        await push.send(b"\x90" * (2 * limit))
        # libzmq refuses the frame by dropping the connection that carried it.
        event = parse_monitor_message(await asyncio.wait_for(monitor.recv_multipart(), WAIT))
        assert event["event"] == zmq.EVENT_DISCONNECTED
        rest = await asyncio.wait_for(stream.collect(), WAIT)
        assert rest[-1].finish_reason == FinishReason.LENGTH and len(tokens(rest)) == 199
        assert eng.counters.decode_errors == 0 and eng.status is EngineStatus.READY


async def test_malformed_handshake_frames_leave_control_running(
    linked: EngineClient, sim: EngineProc, ctx: Strangers
) -> None:
    eng = linked.engines[sim.name]
    stranger = ctx.socket(zmq.DEALER)
    stranger.connect(sim.spec.handshake)
    await stranger.send_multipart([b"one", b"two"])  # the ROUTER sees 3 frames
    await stranger.send(b"\xc1")  # 2 frames, not msgpack
    await dropped(eng, lambda c: c.malformed_frames == 1 and c.decode_errors == 1)
    # The control task still runs: a restarted engine is handshaken and adopted again.
    sim.kill()
    sim.spawn()
    await linked.wait_connects(sim.name, 2, 60.0)
    out = await (await linked.submit(sim.name, make_request(random_prompt(8), 3))).collect()
    assert len(tokens(out)) == 3
    assert eng.counters.task_restarts == 0


async def test_second_identity_on_input_is_refused(
    linked: EngineClient, sim: EngineProc, ctx: Strangers
) -> None:
    eng = linked.engines[sim.name]
    stream = await linked.submit(sim.name, make_request(random_prompt(16), 200))
    await anext(stream)
    # One stranger claims the engine's identity, one speaks under its own.
    impostor = ctx.socket(zmq.DEALER)
    impostor.setsockopt(zmq.ROUTING_ID, eng.identity)
    impostor.connect(sim.spec.input_address)
    await impostor.send(b"")
    other = ctx.socket(zmq.DEALER)
    other.connect(sim.spec.input_address)
    await other.send(b"\x80")  # an (empty) ready map
    await dropped(eng, lambda c: c.refused_identities == 1)
    rest = await asyncio.wait_for(stream.collect(), WAIT)
    assert rest[-1].finish_reason == FinishReason.LENGTH and len(tokens(rest)) == 199
    # New requests still reach the engine, not a stranger.
    out = await (await linked.submit(sim.name, make_request(random_prompt(8), 3))).collect()
    assert len(tokens(out)) == 3
    assert await impostor.poll(0) == 0 and await other.poll(0) == 0
    assert eng.status is EngineStatus.READY and eng.counters.deaths == 0


async def test_fake_hello_and_ready_are_refused(
    linked: EngineClient, sim: EngineProc, ctx: Strangers
) -> None:
    eng = linked.engines[sim.name]
    streams = [
        await linked.submit(sim.name, make_request(random_prompt(16), 100)) for _ in range(4)
    ]
    for s in streams:
        await anext(s)
    stranger = ctx.socket(zmq.DEALER)
    stranger.connect(sim.spec.handshake)
    await stranger.send(msgspec.msgpack.encode({"status": "HELLO", "local": False,
                                                "headless": True}))
    await dropped(eng, lambda c: c.refused_handshakes == 1)
    await stranger.send(msgspec.msgpack.encode({"status": "READY"}))
    await dropped(eng, lambda c: c.refused_handshakes == 2)
    for s in streams:
        rest = await asyncio.wait_for(s.collect(), WAIT)
        assert rest[-1].finish_reason == FinishReason.LENGTH and len(tokens(rest)) == 99
    # Not answered with the engine's addresses.
    assert await stranger.poll(0) == 0
    assert eng.status is EngineStatus.READY and eng.counters.deaths == 0


async def test_forged_engine_core_dead_is_ignored(
    linked: EngineClient, sim: EngineProc, ctx: Strangers
) -> None:
    eng = linked.engines[sim.name]
    stream = await linked.submit(sim.name, make_request(random_prompt(16), 200))
    await anext(stream)
    push = ctx.socket(zmq.PUSH)
    push.connect(sim.spec.output_address)
    await push.send(ENGINE_CORE_DEAD)
    await dropped(eng, lambda c: c.forged_deaths == 1)
    rest = await asyncio.wait_for(stream.collect(), WAIT)
    assert rest[-1].finish_reason == FinishReason.LENGTH and len(tokens(rest)) == 199
    assert eng.status is EngineStatus.READY and eng.counters.deaths == 0


@pytest.mark.parametrize(
    "forged",
    [
        {"num_running_reqs": 0, "num_waiting_reqs": 10**9, "kv_cache_usage": 0.5},
        {"num_running_reqs": 0, "num_waiting_reqs": 1e9},
        {"num_running_reqs": "lots", "num_waiting_reqs": 0, "kv_cache_usage": "full"},
        {"num_running_reqs": 0, "num_waiting_reqs": 0, "kv_cache_usage": float("nan")},
    ],
)
async def test_forged_scheduler_stats_change_nothing(
    linked: EngineClient, sim: EngineProc, ctx: Strangers, forged: dict[str, object]
) -> None:
    eng = linked.engines[sim.name]
    out = await (await linked.submit(sim.name, make_request(random_prompt(8), 3))).collect()
    assert len(tokens(out)) == 3
    before = eng.queue_counts
    push = ctx.socket(zmq.PUSH)
    push.connect(sim.spec.output_address)
    await push.send(msgspec.msgpack.encode(EngineCoreOutputs(scheduler_stats=forged)))
    await push.send(b"\xc1")  # same connection, so it arrives after the forged stats
    await dropped(eng, lambda c: c.decode_errors == 1)
    counts = eng.queue_counts
    assert counts == before and counts.num_waiting_reqs <= MAX_QUEUE_COUNT
    assert eng.scheduler_stats is None or eng.scheduler_stats.get("num_waiting_reqs") != 10**9
    # What /metrics reads: plain numbers, no exception.
    snapshot = _engine_snapshot(linked)()[sim.name]
    assert all(isinstance(v, float) for v in snapshot.values())
    assert snapshot["engine_waiting_requests"] < MAX_QUEUE_COUNT
    assert eng.counters.refused_stats == 1


async def test_peer_outside_the_allow_list_cannot_connect(ctx: Strangers) -> None:
    spec = EngineSpec("z", "tcp://127.0.0.1:0")
    async with EngineClient([spec], allowed_peers=["127.0.0.1"]) as client:
        eng = client.engines["z"]
        monitor = eng.output.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        port = eng.output_endpoint.rsplit(":", 1)[1]
        # The stranger's source address is 127.0.0.2: refused by the ZAP handler.
        stranger = ctx.socket(zmq.PUSH)
        stranger.connect(f"tcp://127.0.0.2:0;127.0.0.1:{port}")
        await stranger.send(b"\xc1from a stranger")
        event = parse_monitor_message(await asyncio.wait_for(monitor.recv_multipart(), WAIT))
        assert event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        # An admitted peer gets through (its junk is read and counted).
        friend = ctx.socket(zmq.PUSH)
        friend.connect(eng.output_endpoint)
        await friend.send(b"\xc1from loopback")
        await dropped(eng, lambda c: c.decode_errors == 1)
        eng.output.disable_monitor()
        monitor.close(linger=0)
        assert eng.counters.decode_errors == 1


async def test_admitted_engine_handshakes_over_tcp(tmp_path: Path) -> None:
    # The real engine (simulated) from 127.0.0.1 passes the ZAP handler on all three sockets.
    sim = make_engine("sim", "t0", tmp_path, **SIM_FLAGS)
    sim.spec = EngineSpec("t0", "tcp://127.0.0.1:0")
    try:
        async with EngineClient([sim.spec], allowed_peers=["127.0.0.1"]) as client:
            eng = client.engines["t0"]
            at = sim.argv.index("--handshake-address") + 1
            sim.argv[at] = eng.handshake_endpoint
            sim.spawn()
            await client.wait_ready(60.0)
            out = await (await client.submit("t0", make_request(random_prompt(8), 3))).collect()
            assert len(tokens(out)) == 3
            assert eng.counters.refused_identities == 0
    finally:
        sim.kill()


def _reachable(host: str, port: str) -> bool:
    try:
        with socket.create_connection((host, int(port)), timeout=WAIT):
            return True
    except ConnectionRefusedError:
        return False


async def test_a_wildcard_handshake_binds_its_input_and_output_on_one_interface() -> None:
    """``tcp://0.0.0.0:P`` asks for every interface for the handshake; the input and output
    sockets bind only the interface the engine is told to dial (loopback here), so another
    address of this host (127.0.0.2) reaches the handshake and nothing else."""
    async with EngineClient([EngineSpec("w", "tcp://0.0.0.0:0")]) as client:
        eng = client.engines["w"]
        for sock in (eng.input, eng.output):
            bound = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            assert bound.startswith("tcp://127.0.0.1:"), bound
            assert not _reachable("127.0.0.2", bound.rsplit(":", 1)[1])
            assert _reachable("127.0.0.1", bound.rsplit(":", 1)[1])
        handshake = eng.handshake.getsockopt_string(zmq.LAST_ENDPOINT)
        assert handshake.startswith("tcp://0.0.0.0:")
        assert _reachable("127.0.0.2", handshake.rsplit(":", 1)[1])


async def test_kv_sub_the_router_binds_admits_only_allowed_peers(ctx: Strangers) -> None:
    """An engine configured to connect its KV publisher to the router: the SUB the router binds
    passes the same ZAP allow-list as the engine sockets."""
    index = NaiveIndex()
    async with KVSubscriber(index, allowed_peers=["127.0.0.1"]) as kv:
        address = kv.add_engine(KVEndpoints("k", "tcp://127.0.0.1:0"))
        assert address.startswith("tcp://127.0.0.1:")
        sub = kv._feeds["k"].sub
        monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        port = address.rsplit(":", 1)[1]
        # The stranger (source 127.0.0.2) is refused: its forged blocks never arrive.
        stranger = ctx.socket(zmq.XPUB)
        stranger.connect(f"tcp://127.0.0.2:0;127.0.0.1:{port}")
        event = parse_monitor_message(await asyncio.wait_for(monitor.recv_multipart(), WAIT))
        assert event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        sub.disable_monitor()
        monitor.close(linger=0)  # a socket of the subscriber's context: closed before it ends
        forged = batch(stored([66], None, [6, 6, 6, 6]))
        await stranger.send_multipart([b"", (0).to_bytes(8, "big"), forged])
        # The admitted peer's batch is applied. An XPUB hears the SUB's subscription: sent after
        # it, the batch is not dropped as unsubscribed.
        friend = ctx.socket(zmq.XPUB)
        friend.connect(address)
        assert await asyncio.wait_for(friend.recv(), WAIT) == b"\x01"
        applied = asyncio.ensure_future(kv.wait_applied("k", WAIT))
        await friend.send_multipart([b"", (0).to_bytes(8, "big"),
                                     batch(stored([1], None, [1, 2, 3, 4]))])
        await applied
        counters = kv.counters("k")
        assert (counters.batches, counters.decode_errors, counters.last_seq) == (1, 0, 0)
        assert index.match("k", [1, 2, 3, 4], BS) == 4
        assert index.match("k", [6, 6, 6, 6], BS) == 0
