"""Stream vs collected responses, n > 1, usage, finish reasons, abort signals and error chunks."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from output.collect import collect
from output.detokenize import TokenDecoder
from output.parsers.registry import ModelParsers, RequestOptions
from output.pipeline import (
    CHAT,
    COMPLETION,
    GENERATE,
    Pipeline,
    PipelineSpec,
    interleave,
)
from output.sse import DONE, StreamEnd, sse_stream
from serving.errors import EngineDeadError
from wire.engine import EngineCoreOutput, EngineError, FinishReason


def _choices(streams: Sequence[AsyncIterator[EngineCoreOutput]]) -> AsyncIterator[
        tuple[int, EngineCoreOutput]]:
    """Choice i's outputs come from ``streams[i]``, interleaved as the router does."""
    return interleave(enumerate(streams))


QWEN3 = Path(__file__).resolve().parent.parent / "render" / "models" / "qwen3" / "tokenizer.json"
IM_END = 151645


@pytest.fixture(scope="module")
def decoder() -> TokenDecoder:
    return TokenDecoder(Tokenizer.from_file(str(QWEN3)))


def _steps(ids: Sequence[int], sizes: Sequence[int], finish: int | None, stop_reason: Any = None,
           cached: int | None = None) -> list[EngineCoreOutput]:
    """Engine outputs carrying ``ids`` in batches of ``sizes`` (cycled); the last one finishes."""
    outs: list[EngineCoreOutput] = []
    i = k = 0
    while i < len(ids) or not outs:
        n = max(1, sizes[k % len(sizes)]) if sizes else 1
        k += 1
        outs.append(EngineCoreOutput("r", list(ids[i:i + n])))
        i += n
    outs[0].prefill_stats = None if cached is None else {"num_cached_tokens": cached}
    outs[-1].finish_reason, outs[-1].stop_reason = finish, stop_reason
    return outs


async def _iterate(outs: list[EngineCoreOutput]) -> AsyncIterator[EngineCoreOutput]:
    for o in outs:
        await asyncio.sleep(0)  # interleave choices like separate engine requests do
        yield o


def _spec(kind: str, **kw: Any) -> PipelineSpec:
    return PipelineSpec(kind=kind, request_id="id-1", model="m", created=7, prompt_tokens=5, **kw)


async def _stream(spec: PipelineSpec, td: TokenDecoder, per_choice: list[list[EngineCoreOutput]],
                  aborted: list[int] | None = None) -> list[bytes]:
    async def abort(i: int) -> None:
        if aborted is not None:
            aborted.append(i)

    return [b async for b in sse_stream(Pipeline(spec, td),
                                        _choices([_iterate(o) for o in per_choice]), abort)]


async def _collect(spec: PipelineSpec, td: TokenDecoder,
                   per_choice: list[list[EngineCoreOutput]]) -> dict[str, Any]:
    body = await collect(Pipeline(spec, td), _choices([_iterate(o) for o in per_choice]))
    result: dict[str, Any] = json.loads(msgspec.json.encode(body))
    return result


def _events(raw: list[bytes]) -> list[Any]:
    """Parse an SSE body the way a client does; the last event must be [DONE]."""
    data = b"".join(raw)
    assert data.endswith(DONE)
    parts = [p for p in data.split(b"\n\n") if p]
    assert all(p.startswith(b"data: ") for p in parts)
    return [json.loads(p[6:]) for p in parts[:-1]]


def _fold(events: list[Any], n: int, kind: str) -> dict[str, Any]:
    """An independent client-side reassembly of a streamed response."""
    text = [""] * n
    finish: list[Any] = [None] * n
    lps: list[list[Any]] = [[] for _ in range(n)]
    usage = None
    for e in events:
        usage = e.get("usage") or usage
        for c in e["choices"]:
            i = c["index"]
            part = c["delta"].get("content") if kind == CHAT else c.get("text")
            text[i] += part or ""
            if c.get("finish_reason") is not None:
                finish[i] = (c["finish_reason"], c.get("stop_reason"))
            if c.get("logprobs"):
                lp = c["logprobs"]
                lps[i] += lp["content"] if kind == CHAT else lp["tokens"]
    return {"text": text, "finish": finish, "usage": usage, "logprobs": lps}


ids_st = st.lists(st.integers(0, 151668), max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    data=st.data(),
    kind=st.sampled_from([CHAT, COMPLETION]),
    n=st.integers(1, 3),
    stops=st.lists(st.sampled_from([" the", "e", ".", "ing", "\n\n", "日本"]), max_size=2),
    include=st.booleans(),
    logprobs=st.sampled_from([None, 0, 2]),
)
def test_stream_and_collected_agree(decoder: TokenDecoder, data: st.DataObject, kind: str, n: int,
                                    stops: list[str], include: bool,
                                    logprobs: int | None) -> None:
    tok = decoder.tokenizer
    per_choice = []
    for _ in range(n):
        text = data.draw(st.text(max_size=60))
        ids = tok.encode(text).ids + data.draw(ids_st.map(lambda x: x[:5]))
        sizes = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
        finish = data.draw(st.sampled_from([FinishReason.LENGTH, FinishReason.STOP]))
        outs = _steps(ids, sizes, int(finish), cached=3)
        if logprobs is not None:
            for o in outs:
                if o.new_token_ids:
                    o.new_logprobs = _logprobs([[t] * (logprobs + 1) for t in o.new_token_ids])
        per_choice.append(outs)
    spec = _spec(kind, n=n, stop=tuple(stops), include_stop_str_in_output=include,
                 logprobs=logprobs, include_usage=True, usage_details=True)
    streamed = _fold(_events(asyncio.run(_stream(spec, decoder, per_choice))), n, kind)
    body = asyncio.run(_collect(spec, decoder, per_choice))
    assert streamed["usage"] == body["usage"]
    for i, c in enumerate(body["choices"]):
        text = c["message"]["content"] if kind == CHAT else c["text"]
        assert streamed["text"][i] == text
        assert streamed["finish"][i] == (c["finish_reason"], c.get("stop_reason"))
        if logprobs is not None:
            got = c["logprobs"]["content"] if kind == CHAT else c["logprobs"]["tokens"]
            assert streamed["logprobs"][i] == got
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}


def _logprobs(rows: list[list[int]]) -> Any:
    import numpy as np

    from wire.ndarrays import Logprobs

    arr = np.array(rows, dtype=np.int32)
    return Logprobs(arr, np.full(arr.shape, -0.25, dtype=np.float32),
                    np.ones(len(rows), dtype=np.int32), None)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(ids=ids_st, sizes=st.lists(st.integers(1, 5), min_size=1, max_size=3),
       skip=st.booleans())
def test_text_equals_decode_of_engine_tokens(decoder: TokenDecoder, ids: list[int],
                                             sizes: list[int], skip: bool) -> None:
    spec = _spec(CHAT, skip_special_tokens=skip)
    body = asyncio.run(_collect(spec, decoder, [_steps(ids, sizes, int(FinishReason.LENGTH))]))
    choice = body["choices"][0]
    assert choice["message"]["content"] == decoder.tokenizer.decode(ids, skip_special_tokens=skip)
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == len(ids)


def test_one_chunk_per_engine_batch_and_role_first(decoder: TokenDecoder) -> None:
    ids = decoder.tokenizer.encode("one two three four five six").ids
    events = _events(asyncio.run(_stream(_spec(CHAT), decoder, [_steps(ids, [3], 1)])))
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    contents = [e["choices"][0]["delta"]["content"] for e in events[1:]]
    assert contents == ["one two three", " four five six"]
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert all(e["object"] == "chat.completion.chunk" and e["id"] == "id-1" for e in events)


def test_eos_text_is_left_out_and_stop_token_reported(decoder: TokenDecoder) -> None:
    ids = decoder.tokenizer.encode("Hi").ids + [IM_END]
    spec = _spec(CHAT, skip_special_tokens=False)
    body = asyncio.run(_collect(spec, decoder, [_steps(ids, [1], 0, stop_reason=IM_END)]))
    c = body["choices"][0]
    # vLLM drops the text of the token that stopped the engine unless include_stop_str_in_output.
    assert (c["message"]["content"], c["finish_reason"], c["stop_reason"]) == ("Hi", "stop", IM_END)
    spec = _spec(CHAT, skip_special_tokens=False, include_stop_str_in_output=True)
    body = asyncio.run(_collect(spec, decoder, [_steps(ids, [1], 0, stop_reason=IM_END)]))
    assert body["choices"][0]["message"]["content"] == "Hi<|im_end|>"


def test_stop_string_aborts_engine_and_cuts(decoder: TokenDecoder) -> None:
    ids = decoder.tokenizer.encode("Count: 1, 2, 3, 4, 5").ids
    aborted: list[int] = []
    spec = _spec(COMPLETION, n=2, stop=(", 3",))
    outs = [_steps(ids, [2], 1), _steps(ids[:4], [1], 1)]
    events = _events(asyncio.run(_stream(spec, decoder, outs, aborted)))
    folded = _fold(events, 2, COMPLETION)
    assert folded["text"] == ["Count: 1, 2", decoder.tokenizer.decode(ids[:4])]
    assert folded["finish"] == [("stop", ", 3"), ("length", None)]
    assert aborted == [0]  # only the choice the router stopped; choice 1 ended on its own


def test_usage_continuous_and_final(decoder: TokenDecoder) -> None:
    ids = decoder.tokenizer.encode("a b c d").ids
    spec = _spec(CHAT, n=2, include_usage=True, continuous_usage=True, usage_details=True)
    events = _events(asyncio.run(_stream(spec, decoder, [_steps(ids, [1], 1, cached=2),
                                                         _steps(ids[:2], [1], 1)])))
    final = events[-1]
    assert final["choices"] == []
    total = len(ids) + 2
    assert final["usage"] == {"prompt_tokens": 5, "completion_tokens": total,
                              "total_tokens": 5 + total,
                              "prompt_tokens_details": {"cached_tokens": 2}}
    per_choice = [e["usage"]["completion_tokens"] for e in events[2:-1]
                  if e["choices"][0]["index"] == 0]
    assert per_choice == list(range(1, len(ids) + 1))


def test_error_chunk_mid_stream(decoder: TokenDecoder) -> None:
    ids = decoder.tokenizer.encode("partial answer").ids
    outs = _steps(ids, [1], None)
    outs.append(EngineCoreOutput("r", [], finish_reason=int(FinishReason.ERROR)))
    events = _events(asyncio.run(_stream(_spec(CHAT), decoder, [outs])))
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == (
        "partial answer")
    assert events[-1]["error"]["code"] == 500 and events[-1]["error"]["type"]
    # A 0.33 engine error travels with its message; a link failure mid-stream too.
    outs = [EngineCoreOutput("r", [1], error=EngineError(3, "cache miss"))]
    assert _events(asyncio.run(_stream(_spec(CHAT), decoder, [outs])))[-1]["error"][
        "message"] == "cache miss"

    async def broken() -> AsyncIterator[EngineCoreOutput]:
        yield EngineCoreOutput("r", ids[:1])
        raise ConnectionError("engine died")

    async def run() -> list[bytes]:
        return [b async for b in sse_stream(Pipeline(_spec(CHAT), decoder), _choices([broken()]))]

    last = _events(asyncio.run(run()))[-1]
    assert "engine died" in last["error"]["message"] and last["error"]["code"] == 500

    async def dead() -> AsyncIterator[EngineCoreOutput]:
        yield EngineCoreOutput("r", ids[:1])
        raise EngineDeadError("engine e0 sent ENGINE_CORE_DEAD")

    async def run_dead() -> list[bytes]:
        return [b async for b in sse_stream(Pipeline(_spec(CHAT), decoder), _choices([dead()]))]

    last = _events(asyncio.run(run_dead()))[-1]
    assert last["error"]["code"] == 503 and "ENGINE_CORE_DEAD" in last["error"]["message"]


def test_an_error_is_recorded_before_its_event_is_written(decoder: TokenDecoder) -> None:
    """A client that reads the error event, then the router's /metrics, must see it counted:
    the end is recorded (and ``on_error`` run) before the write that carries the event."""
    recorded: list[str] = []

    async def dead() -> AsyncIterator[EngineCoreOutput]:
        yield EngineCoreOutput("r", decoder.tokenizer.encode("partial").ids[:1])
        raise EngineDeadError("engine e0 sent ENGINE_CORE_DEAD")

    async def run() -> tuple[list[bytes], list[list[str]], StreamEnd]:
        end = StreamEnd(on_error=lambda e: recorded.append(e.message))
        seen: list[bytes] = []
        at_write: list[list[str]] = []  # what was recorded as each write left
        async for b in sse_stream(Pipeline(_spec(CHAT), decoder), _choices([dead()]), end=end):
            seen.append(b)
            at_write.append(list(recorded))
        return seen, at_write, end

    seen, at_write, end = asyncio.run(run())
    assert _events(seen)[-1]["error"]["code"] == 503
    assert end.error is not None and at_write[-1] == [end.error.message]
    assert all(not r for r in at_write[:-1]) and not end.completed


def test_collected_raises_on_error(decoder: TokenDecoder) -> None:
    from serving.errors import EngineOutputError

    outs = [EngineCoreOutput("r", [], finish_reason=int(FinishReason.ERROR))]
    with pytest.raises(EngineOutputError):
        asyncio.run(_collect(_spec(CHAT), decoder, [outs]))


def test_generate_tokens_shapes(decoder: TokenDecoder) -> None:
    ids = [11, 22, 33, 44]
    spec = _spec(GENERATE, include_usage=True)
    events = _events(asyncio.run(_stream(spec, decoder, [_steps(ids, [3], 1)])))
    assert [e["choices"][0]["token_ids"] for e in events[:-1]] == [[11, 22, 33], [44]]
    assert events[-1]["usage"]["completion_tokens"] == 4 and events[-1]["choices"] == []
    body = asyncio.run(_collect(_spec(GENERATE, prompt_token_ids=[1, 2]), decoder,
                                [_steps(ids, [3], 1)]))
    assert body["output_mode"] == "tokens" and body["prompt_token_ids"] == [1, 2]
    assert body["choices"] == [{"index": 0, "finish_reason": "length", "token_ids": ids}]
    # Text mode detokenizes; stop strings trim the token ids as vLLM's generate does.
    tid = decoder.tokenizer.encode("ab cd ef").ids
    body = asyncio.run(_collect(_spec(GENERATE, output_mode="text", stop=(" cd",)), decoder,
                                [_steps(tid, [1], None)]))
    c = body["choices"][0]
    assert (c["text"], c["finish_reason"], c["stop_reason"]) == ("ab", "stop", " cd")
    assert decoder.tokenizer.decode(c["token_ids"]) == "ab cd"


@pytest.mark.parametrize("batch", [1, 2, 5])
def test_parser_stage_seam(decoder: TokenDecoder, batch: int) -> None:
    tok = decoder.tokenizer
    start, end = tok.token_to_id("<think>"), tok.token_to_id("</think>")
    ids = [start, *tok.encode("Let me think.").ids, end, *tok.encode("The answer is 4.").ids]
    spec = _spec(CHAT)
    parsers = ModelParsers(None, "qwen3", False, tokenizer=tok).for_request(RequestOptions(), [])
    assert parsers is not None

    def run_stream() -> list[bytes]:
        async def go() -> list[bytes]:
            pipe = Pipeline(spec, decoder, parsers=parsers)
            outs = _choices([_iterate(_steps(ids, [batch], 1))])
            return [b async for b in sse_stream(pipe, outs)]
        return asyncio.run(go())

    async def run_collect() -> Any:
        pipe = Pipeline(spec, decoder, parsers=parsers)
        return await collect(pipe, _choices([_iterate(_steps(ids, [batch], 1))]))

    events = _events(run_stream())
    reasoning = "".join(e["choices"][0]["delta"].get("reasoning_content") or "" for e in events)
    alias = "".join(e["choices"][0]["delta"].get("reasoning") or "" for e in events)
    content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    body = asyncio.run(run_collect())
    msg = body.choices[0].message
    assert (reasoning, content) == ("Let me think.", "The answer is 4.")
    assert alias == reasoning
    assert (msg.reasoning_content, msg.reasoning, msg.content) == (reasoning, reasoning, content)


def test_completion_echo_and_token_ids(decoder: TokenDecoder) -> None:
    ids = decoder.tokenizer.encode(" and more").ids
    spec = _spec(COMPLETION, echo="Prompt", return_token_ids=True)
    events = _events(asyncio.run(_stream(spec, decoder, [_steps(ids, [1], 1)])))
    assert _fold(events, 1, COMPLETION)["text"] == ["Prompt and more"]
    body = asyncio.run(_collect(spec, decoder, [_steps(ids, [1], 1)]))
    assert body["choices"][0]["text"] == "Prompt and more"
    assert body["choices"][0]["token_ids"] == ids


@pytest.mark.parametrize("kind", [CHAT, COMPLETION])
def test_kv_transfer_params_from_the_engine_reach_the_body(decoder: TokenDecoder,
                                                           kind: str) -> None:
    """vLLM's body carries the engine's kv_transfer_params (disaggregated prefill's handle)."""
    outs = _steps(decoder.tokenizer.encode("a b").ids, [1], 1)
    outs[-1].kv_transfer_params = {"do_remote_decode": False, "remote_block_ids": [3]}
    body = asyncio.run(_collect(_spec(kind), decoder, [outs]))
    assert body["kv_transfer_params"] == {"do_remote_decode": False, "remote_block_ids": [3]}
    assert "kv_transfer_params" not in asyncio.run(_collect(_spec(kind), decoder, [
        _steps(decoder.tokenizer.encode("a b").ids, [1], 1)]))


def test_usage_details_only_when_switched_on(decoder: TokenDecoder) -> None:
    """vLLM's --enable-prompt-tokens-details: off by default, the engine's cached tokens kept
    out of usage."""
    outs = _steps(decoder.tokenizer.encode("a b").ids, [1], 1, cached=2)
    body = asyncio.run(_collect(_spec(CHAT), decoder, [outs]))
    assert "prompt_tokens_details" not in body["usage"]
