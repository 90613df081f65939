"""The engine client against a simulated engine AND a real vLLM engine: one suite, so they agree."""

from __future__ import annotations

import asyncio
import math
import random
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from radix import PrefixIndex
from router.kvfeed.kv_subscriber import KVSubscriber, kv_namespace
from router.link.engine_client import EngineClient, EngineDeadError, EngineStatus, UtilityCallError
from tests.engines import EngineProc, NaiveIndex, Tee
from wire.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
from wire.ndarrays import LogprobRows
from wire.sampling import OUTPUT_DELTA, SamplingParams


def make_request(
    prompt: list[int], max_tokens: int, **sampling: object
) -> EngineCoreRequest:
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=0.0,
        ignore_eos=True,
        output_kind=OUTPUT_DELTA,
        **sampling,  # type: ignore[arg-type]
    )
    rid = f"t-{uuid.uuid4().hex[:12]}"
    return EngineCoreRequest(rid, prompt, None, params, None, time.time(), None, None, None)


def random_prompt(n: int, seed: int | None = None) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 100_000) for _ in range(n)]


def tokens(outputs: list[EngineCoreOutput]) -> list[int]:
    return [t for o in outputs for t in o.new_token_ids]


@pytest.fixture
async def link(engine: EngineProc) -> AsyncIterator[EngineClient]:
    """A fresh client on the engine's addresses: the engine is re-adopted, not re-handshaken."""
    async with EngineClient([engine.spec], dead_after=60.0) as client:
        await client.wait_ready(60.0)
        yield client


async def test_handshake_ready_response(engine: EngineProc) -> None:
    ready = engine.ready
    assert ready is not None
    assert ready.max_model_len == 512
    assert ready.block_size > 0 and ready.num_gpu_blocks > 0
    assert ready.data_parallel_rank == 0
    assert ready.kv_events_config is not None
    assert ready.kv_events_config["endpoint"] == engine.kv.endpoint
    assert ready.kv_events_config["replay_endpoint"] == engine.kv.replay_endpoint
    assert ready.vllm_version.startswith("0.")


async def test_readopted_after_router_restart(link: EngineClient, engine: EngineProc) -> None:
    state = link.engines[engine.name]
    assert state.adopted and state.ready is None
    out = await (await link.submit(engine.name, make_request(random_prompt(20), 3))).collect()
    assert len(tokens(out)) == 3


async def test_streamed_tokens(link: EngineClient, engine: EngineProc) -> None:
    prompt = random_prompt(40)
    stream = await link.submit(engine.name, make_request(prompt, 6))
    outputs = await stream.collect()
    assert len(tokens(outputs)) == 6
    assert all(o.finish_reason is None for o in outputs[:-1])
    assert outputs[-1].finish_reason == FinishReason.LENGTH
    first = outputs[0]
    assert first.prefill_stats is not None
    assert first.prefill_stats["num_prompt_tokens"] == len(prompt)
    state = link.engines[engine.name]
    assert state.num_in_flight == 0
    assert state.scheduler_stats is not None and "num_running_reqs" in state.scheduler_stats


async def test_logprobs_arrays(link: EngineClient, engine: EngineProc) -> None:
    stream = await link.submit(engine.name, make_request(random_prompt(30), 4, logprobs=2))
    outputs = await stream.collect()
    for out in outputs:
        lp = out.new_logprobs
        assert isinstance(lp, LogprobRows)
        assert lp.width == 3 and len(lp.token_ids) == 3 * len(out.new_token_ids)
        # Column 0 is the sampled token itself.
        assert list(lp.token_ids[::3]) == out.new_token_ids
        assert all(math.isfinite(x) and x <= 0 for x in lp.logprobs)


async def test_concurrent_streams(link: EngineClient, engine: EngineProc) -> None:
    reqs = [make_request(random_prompt(16 + i), 2 + i % 5) for i in range(12)]
    streams = [await link.submit(engine.name, r) for r in reqs]
    results = await asyncio.gather(*(s.collect() for s in streams))
    for req, outs in zip(reqs, results, strict=True):
        assert req.sampling_params is not None
        assert len(tokens(outs)) == req.sampling_params.max_tokens
        assert {o.request_id for o in outs} == {req.request_id}


async def test_abort_finishes_stream(link: EngineClient, engine: EngineProc) -> None:
    long = make_request(random_prompt(32), 400)
    stream = await link.submit(engine.name, long)
    seen = [await anext(stream)]
    # The two counts routing reads, decoded alone, agree with the whole map (running: this one).
    # They are read as the stream goes on: vLLM attaches a step's stats to ONE front-end's
    # outputs, and a shared engine's first message to a new client may carry stats that predate
    # this request (seen once in CI, after other clients had used the session's engine).
    state = link.engines[engine.name]
    while state.queue_counts.num_running_reqs < 1 and len(seen) < 50:
        seen.append(await anext(stream))
    assert all(o.finish_reason is None for o in seen)
    counts, whole = state.queue_counts, state.scheduler_stats
    assert whole is not None and counts.num_running_reqs >= 1
    assert (counts.num_running_reqs, counts.num_waiting_reqs) == (
        whole["num_running_reqs"], whole["num_waiting_reqs"])
    await link.abort([long.request_id])
    rest = await stream.collect()
    assert rest[-1].finish_reason == FinishReason.ABORT
    assert len(tokens([*seen, *rest])) < 400
    assert link.engines[engine.name].num_in_flight == 0
    # The engine really dropped it: it keeps serving, and stops counting the aborted request.
    out = await (await link.submit(engine.name, make_request(random_prompt(10), 2))).collect()
    assert len(tokens(out)) == 2
    stats = link.engines[engine.name].scheduler_stats
    assert stats is not None and stats["num_running_reqs"] == 0
    assert link.engines[engine.name].queue_counts.num_running_reqs == 0


async def test_utility_calls(link: EngineClient, engine: EngineProc) -> None:
    assert await link.call_utility(engine.name, "reset_prefix_cache") is True
    assert await link.call_utility(engine.name, "is_sleeping") is False
    with pytest.raises(UtilityCallError, match="no_such_method"):
        await link.call_utility(engine.name, "no_such_method")


async def test_kv_events_and_prefix_hits(link: EngineClient, engine: EngineProc) -> None:
    assert engine.ready is not None
    bs = engine.ready.block_size
    name = engine.name
    assert await link.call_utility(name, "reset_prefix_cache") is True
    index = NaiveIndex()
    radix = PrefixIndex(max_blocks=100_000)
    radix.add_engine(name, bs)
    async with KVSubscriber(Tee(index, radix)) as sub:
        sub.add_engine(engine.kv)
        prompt = random_prompt(2 * bs + bs // 2)
        first = await (await link.submit(name, make_request(prompt, 3))).collect()
        assert first[0].prefill_stats is not None
        assert first[0].prefill_stats["num_cached_tokens"] == 0
        # The blocks of the first request, whether they came live or from the replay buffer.
        await sub.resync(name)
        assert index.match(name, prompt, bs) == 2 * bs
        again = await (await link.submit(name, make_request(prompt, 3))).collect()
        assert again[0].prefill_stats is not None
        cached = again[0].prefill_stats["num_cached_tokens"]
        assert cached > 0
        assert cached == index.match(name, prompt, bs)
        ns = kv_namespace(None, None)
        assert radix.match(prompt, ns, time.time())[name].confirmed_tokens == cached

        # Live path: a new prefix's BlockStored arrives on the SUB socket by itself.
        other = random_prompt(bs + 4)
        await (await link.submit(name, make_request(other, 2))).collect()
        deadline = time.monotonic() + 20
        while index.match(name, other, bs) < bs:
            await sub.wait_applied(name, max(0.1, deadline - time.monotonic()))
        c = sub.counters(name)
        assert c.decode_errors == 0 and c.batches > 0

        # reset_prefix_cache shows up as AllBlocksCleared (on the engine's next step).
        cleared = index.cleared.get(name, 0)
        assert await link.call_utility(name, "reset_prefix_cache") is True
        await (await link.submit(name, make_request(random_prompt(8), 1))).collect()
        deadline = time.monotonic() + 20
        while index.cleared.get(name, 0) == cleared:
            await sub.wait_applied(name, max(0.1, deadline - time.monotonic()))
        assert index.match(name, prompt, bs) == 0


async def test_hung_engine_declared_dead_then_recovers(engine: EngineProc) -> None:
    """Silence with work in flight means death; an engine that wakes up serves again."""
    async with EngineClient([engine.spec], dead_after=2.0) as client:
        await client.wait_ready(60.0)
        state = client.engines[engine.name]
        stream = await client.submit(engine.name, make_request(random_prompt(16), 400))
        await anext(stream)
        connects = state.counters.connects
        engine.pause()
        try:
            with pytest.raises(EngineDeadError, match="no output"):
                await asyncio.wait_for(stream.collect(), 30.0)
            assert state.status is EngineStatus.DEAD
        finally:
            engine.resume()
        # The client aborted the orphan and probes the engine; awake, it is ready again.
        await client.wait_connects(engine.name, connects + 1, 30.0)
        assert state.status is EngineStatus.READY
        out = await (await client.submit(engine.name, make_request(random_prompt(8), 2))).collect()
        assert len(tokens(out)) == 2
