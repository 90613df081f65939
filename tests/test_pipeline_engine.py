"""The output pipeline fed by a real engine link: the simulated engine and real vLLM (marker vllm).

Text must equal the detokenized engine tokens exactly; a stop string must cut the text where it
starts and reach the engine as an ABORT; real vLLM logprobs must come out in the chat shape.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from tokenizers import Tokenizer

from output.collect import collect
from output.detokenize import TokenDecoder
from output.openai_types import ChatCompletion, ChatLogprobsContent
from output.pipeline import CHAT, Pipeline, PipelineSpec, interleave
from router.link.engine_client import EngineClient
from tests.engines import EngineProc
from wire.engine import EngineCoreOutput, EngineCoreRequest
from wire.sampling import OUTPUT_DELTA, SamplingParams

QWEN3 = Path(__file__).resolve().parent.parent / "render" / "models" / "qwen3" / "tokenizer.json"


@pytest.fixture(scope="module")
def decoder() -> TokenDecoder:
    return TokenDecoder(Tokenizer.from_file(str(QWEN3)))


@pytest.fixture
async def link(engine: EngineProc) -> AsyncIterator[EngineClient]:
    async with EngineClient([engine.spec], dead_after=60.0) as client:
        await client.wait_ready(60.0)
        yield client


def _request(prompt: list[int], max_tokens: int, **sampling: Any) -> EngineCoreRequest:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                            output_kind=OUTPUT_DELTA, **sampling)
    rid = f"p-{uuid.uuid4().hex[:12]}"
    return EngineCoreRequest(rid, prompt, None, params, None, time.time(), None, None, None)


PROMPT = [9707, 11, 1879, 0, 3555, 525, 498, 3730, 30] * 3


async def _run(link: EngineClient, engine: EngineProc, decoder: TokenDecoder,
               req: EngineCoreRequest, **spec: Any) -> tuple[ChatCompletion, list[int]]:
    """Submit, tee the engine's tokens, run the pipeline to a collected chat body."""
    seen: list[int] = []
    stream = await link.submit(engine.name, req)

    async def tee() -> AsyncIterator[EngineCoreOutput]:
        async for out in stream:
            seen.extend(out.new_token_ids)
            yield out

    async def abort(index: int) -> None:
        await link.abort([req.request_id])

    pipe = Pipeline(PipelineSpec(kind=CHAT, request_id=req.request_id, model="m", created=0,
                                 prompt_tokens=len(PROMPT), usage_details=True, **spec), decoder)
    body = await collect(pipe, interleave([(0, tee())]), abort)
    assert isinstance(body, ChatCompletion)
    return body, seen


async def test_text_is_the_decoded_engine_tokens(link: EngineClient, engine: EngineProc,
                                                 decoder: TokenDecoder) -> None:
    body, seen = await _run(link, engine, decoder, _request(PROMPT, 24))
    choice = body.choices[0]
    assert len(seen) == 24 and choice.finish_reason == "length"
    assert choice.message.content == decoder.tokenizer.decode(seen, skip_special_tokens=True)
    assert body.usage.completion_tokens == 24 and body.usage.prompt_tokens == len(PROMPT)
    assert body.usage.prompt_tokens_details is not None  # the engine's num_cached_tokens


async def test_stop_string_cuts_and_aborts_the_engine(link: EngineClient, engine: EngineProc,
                                                      decoder: TokenDecoder) -> None:
    full, _ = await _run(link, engine, decoder, _request(PROMPT, 40))
    text = full.choices[0].message.content
    assert text is not None and len(text) > 20
    stop = text[len(text) // 2 : len(text) // 2 + 4]
    # Greedy decoding repeats itself on the same prompt, so the stop must land at its first
    # occurrence in the same text.
    req = _request(PROMPT, 40)
    body, _ = await _run(link, engine, decoder, req, stop=(stop,))
    choice = body.choices[0]
    assert choice.message.content == text[: text.find(stop)]
    assert (choice.finish_reason, choice.stop_reason) == ("stop", stop)
    assert body.usage.completion_tokens < 40
    # The ABORT reached the engine link: nothing of this request is in flight any more.
    assert req.request_id not in link.engines[engine.name].in_flight


@pytest.mark.vllm
async def test_real_vllm_logprobs_in_chat_shape(link: EngineClient, engine: EngineProc,
                                                decoder: TokenDecoder) -> None:
    if engine.kind != "vllm":
        pytest.skip("the simulated engine sends no logprobs")
    body, seen = await _run(link, engine, decoder, _request(PROMPT, 8, logprobs=3), logprobs=3)
    lp = body.choices[0].logprobs
    assert lp is not None and lp.content is not None
    content = msgspec.json.decode(msgspec.json.encode(lp.content), type=list[ChatLogprobsContent])
    assert len(content) == 8
    for tid, entry in zip(seen, content, strict=True):
        # vLLM's strings: a token inside a split UTF-8 character reads "" or the character.
        alone = decoder.token_text(tid)
        assert entry.token == alone or alone.endswith("\ufffd")
        assert bytes(entry.bytes or []) == decoder.token_bytes(tid)
        assert entry.logprob <= 0.0 and len(entry.top_logprobs) == 3
        # Greedy: the sampled token is the top candidate.
        assert entry.top_logprobs[0].token == entry.token
