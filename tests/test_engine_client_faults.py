"""Engine faults on real simulated-engine processes: death, hangs, restarts, router restarts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import zmq
import zmq.asyncio

from router.link.engine_client import (
    EngineClient,
    EngineDeadError,
    EngineStatus,
    EngineUnavailableError,
)
from tests.engines import EngineProc, make_engine
from tests.test_engine_client import make_request, random_prompt, tokens
from wire.engine import ENGINE_CORE_DEAD, FinishReason

DEAD_AFTER = 1.0
SIM_FLAGS = {"step_time": "0.01", "block_size": "16"}


@pytest.fixture
def sims(tmp_path: Path) -> Iterator[list[EngineProc]]:
    """Two simulated engines, not yet started (the test's client handshakes with them)."""
    engines = [make_engine("sim", f"s{i}", tmp_path, **SIM_FLAGS) for i in range(2)]
    yield engines
    for e in engines:
        e.kill()


async def start(client: EngineClient, engines: list[EngineProc]) -> None:
    for e in engines:
        e.spawn()
    await client.wait_ready(60.0)


async def test_killed_engine_fails_its_streams_others_continue(sims: list[EngineProc]) -> None:
    a, b = sims
    # The silence deadline is far off: the dropped connection is what ends the streams.
    async with EngineClient([a.spec, b.spec], dead_after=600.0) as client:
        await start(client, sims)
        on_a = await client.submit(a.name, make_request(random_prompt(32), 300))
        on_b = await client.submit(b.name, make_request(random_prompt(32), 300))
        await anext(on_a)
        await anext(on_b)
        a.kill()  # SIGKILL: no ENGINE_CORE_DEAD; its kernel closes its connections
        # Ended by the dropped connection, not by silence ("no output") nor by the generous wait
        # (a hang); how soon after the kill is measured by bench/engine_death.py.
        with pytest.raises(EngineDeadError, match="its connection dropped"):
            await asyncio.wait_for(on_a.collect(), 60)
        assert client.engines[a.name].status is EngineStatus.DEAD
        with pytest.raises(EngineDeadError):
            await client.submit(a.name, make_request(random_prompt(8), 2))
        # The other engine never noticed.
        rest = await on_b.collect()
        assert rest[-1].finish_reason == FinishReason.LENGTH
        assert len(tokens(rest)) + 1 == 300

        # Restarted under the same addresses: a fresh handshake re-adopts it.
        a.spawn()
        await client.wait_ready(60.0, [a.name])
        state = client.engines[a.name]
        assert state.status is EngineStatus.READY and not state.adopted
        assert state.ready is not None and state.counters.deaths == 1
        out = await (await client.submit(a.name, make_request(random_prompt(8), 3))).collect()
        assert len(tokens(out)) == 3


async def test_engine_core_dead_frame(sims: list[EngineProc]) -> None:
    a = sims[0]
    async with EngineClient([a.spec], dead_after=60.0) as client:
        await start(client, [a])
        stream = await client.submit(a.name, make_request(random_prompt(16), 400))
        await anext(stream)
        # What a dying EngineCore sends on its PUSH socket, from a second pusher, while the
        # engine no longer answers (stopped): believed, unlike a forged one from a stranger
        # while the engine answers (tests/test_engine_strangers.py).
        a.pause()
        ctx = zmq.asyncio.Context()
        push = ctx.socket(zmq.PUSH)
        push.connect(a.spec.output_address)
        try:
            await push.send(ENGINE_CORE_DEAD)
            with pytest.raises(EngineDeadError, match="ENGINE_CORE_DEAD"):
                await asyncio.wait_for(stream.collect(), 30.0)
        finally:
            push.close(linger=0)
            ctx.term()
            a.resume()
        assert client.engines[a.name].status is EngineStatus.DEAD
        assert client.engines[a.name].counters.forged_deaths == 0


async def test_router_restart_readopts_engines(sims: list[EngineProc]) -> None:
    a, b = sims
    async with EngineClient([a.spec, b.spec]) as first:
        await start(first, sims)
    # A new router on the same addresses: engines reconnect without a handshake.
    async with EngineClient([a.spec, b.spec], dead_after=DEAD_AFTER) as second:
        await second.wait_ready(30.0)
        assert all(s.adopted for s in second.engines.values())
        streams = [
            await second.submit(e.name, make_request(random_prompt(12), 4)) for e in (a, b)
        ]
        for s in streams:
            assert len(tokens(await s.collect())) == 4


async def test_many_engines_one_client(tmp_path: Path) -> None:
    engines = [make_engine("sim", f"m{i}", tmp_path, **SIM_FLAGS) for i in range(4)]
    try:
        async with EngineClient([e.spec for e in engines]) as client:
            await start(client, engines)
            reqs = [(e.name, make_request(random_prompt(20), 5)) for e in engines for _ in range(5)]
            streams = [await client.submit(name, r) for name, r in reqs]
            results = await asyncio.gather(*(s.collect() for s in streams))
            assert all(len(tokens(r)) == 5 for r in results)
            assert all(st.counters.requests == 5 for st in client.engines.values())
    finally:
        for e in engines:
            e.kill()


async def test_remove_and_re_add_engine_at_run_time(sims: list[EngineProc]) -> None:
    a, b = sims
    async with EngineClient([a.spec, b.spec], dead_after=DEAD_AFTER) as client:
        await start(client, sims)
        on_a = await client.submit(a.name, make_request(random_prompt(16), 200))
        on_b = await client.submit(b.name, make_request(random_prompt(16), 20))
        await anext(on_a)
        await client.remove_engine(a.name)
        with pytest.raises(EngineUnavailableError, match="removed"):
            await on_a.collect()
        assert a.name not in client.engines
        assert len(tokens(await on_b.collect())) == 20
        # Bound again: the still-running engine reconnects and is adopted without a handshake.
        state = client.add_engine(a.spec)
        await client.wait_ready(30.0, [a.name])
        assert state.adopted
        out = await (await client.submit(a.name, make_request(random_prompt(8), 3))).collect()
        assert len(tokens(out)) == 3


async def test_garbage_and_pickles_on_the_output_socket_are_counted(
    sims: list[EngineProc],
) -> None:
    a = sims[0]
    async with EngineClient([a.spec], dead_after=60.0) as client:
        await start(client, [a])
        # Long enough (~2 s of steps) that the junk lands while the request still streams.
        stream = await client.submit(a.name, make_request(random_prompt(16), 200))
        await anext(stream)
        ctx = zmq.asyncio.Context()
        push = ctx.socket(zmq.PUSH)
        push.connect(a.spec.output_address)
        try:
            pickle_ext = msgspec.msgpack.encode(
                [0, [["x", [1], msgspec.msgpack.Ext(1, b"cos\nsystem\n")]]]
            )
            for junk in (b"\xc1garbage", pickle_ext):
                await push.send(junk)
            rest = await asyncio.wait_for(stream.collect(), 30.0)
        finally:
            push.close(linger=0)
            ctx.term()
        assert rest[-1].finish_reason == FinishReason.LENGTH
        assert len(tokens(rest)) == 199
        state = client.engines[a.name]
        assert state.counters.decode_errors == 2
        assert state.status is EngineStatus.READY
