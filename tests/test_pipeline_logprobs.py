"""Engine logprobs (vLLM's ndarray wire form) -> chat, completions and generate logprob shapes."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import numpy as np
import pytest
from tokenizers import Tokenizer

from output.detokenize import TokenDecoder
from output.openai_types import (
    ChatCompletionChunk,
    ChatLogprobs,
    ChatLogprobsContent,
    Completion,
    GenerateLogprobs,
    GenerateResponse,
)
from output.pipeline import CHAT, COMPLETION, GENERATE, Pipeline, PipelineSpec
from wire.engine import EngineCoreOutput, EngineCoreOutputs, enc_hook, ext_hook
from wire.ndarrays import encode_ndarray

QWEN3 = Path(__file__).resolve().parent.parent / "render" / "models" / "qwen3" / "tokenizer.json"


@pytest.fixture(scope="module")
def decoder() -> TokenDecoder:
    return TokenDecoder(Tokenizer.from_file(str(QWEN3)))


def _wire(outputs: list[EngineCoreOutput]) -> list[EngineCoreOutput]:
    """Round-trip through msgpack exactly as outputs travel from the engine (inline arrays)."""
    data = msgspec.msgpack.Encoder(enc_hook=enc_hook).encode(EngineCoreOutputs(outputs=outputs))
    dec = msgspec.msgpack.Decoder(EngineCoreOutputs, ext_hook=ext_hook)
    return dec.decode(data).outputs


def _output(sampled: list[int], top: list[list[int]], lps: list[list[float]],
            ranks: list[int], finish: int | None = None) -> EngineCoreOutput:
    """One engine step: rows are [sampled, top-1 .. top-k] as vLLM's sampler lays them out."""
    ids = np.array([[s, *t] for s, t in zip(sampled, top, strict=True)], dtype=np.int32)
    aux: list[bytes | memoryview] = [b""]
    raw = (encode_ndarray(ids, aux), encode_ndarray(np.array(lps, dtype=np.float32), aux),
           encode_ndarray(np.array(ranks, dtype=np.int32), aux), None)
    assert len(aux) == 1, "small arrays travel inline"
    return EngineCoreOutput("r", sampled, new_logprobs=raw, finish_reason=finish)


def _content(lp: ChatLogprobs | None) -> list[ChatLogprobsContent]:
    """The chat logprobs the pipeline wrote as JSON, decoded against their schema."""
    assert lp is not None and lp.content is not None
    return msgspec.json.decode(msgspec.json.encode(lp.content), type=list[ChatLogprobsContent])


def _spec(kind: str, k: int, **kw: object) -> PipelineSpec:
    return PipelineSpec(kind=kind, request_id="r", model="m", created=0, prompt_tokens=3,
                        logprobs=k, **kw)  # type: ignore[arg-type]


def test_chat_logprobs_shape(decoder: TokenDecoder) -> None:
    a, b, c, d = (decoder.tokenizer.encode(t).ids[0] for t in ("Hello", " world", " there", "!"))
    # Token 1: sampled "Hello" is top-1. Token 2: sampled " world" is rank 2 (behind " there").
    out = _output([a, b], [[a, d], [c, b]], [[-0.1, -0.1, -3.0], [-1.5, -0.5, -1.5]], [1, 2])
    p = Pipeline(_spec(CHAT, 2), decoder)
    chunk, _ = p.feed(0, _wire([out])[0])
    assert isinstance(chunk, ChatCompletionChunk)
    content = _content(chunk.choices[0].logprobs)
    assert len(content) == 2
    first, second = content
    assert (first.token, first.bytes) == ("Hello", list(b"Hello"))
    assert math.isclose(first.logprob, -0.1, rel_tol=1e-6)
    assert [t.token for t in first.top_logprobs] == ["Hello", "!"]
    # vLLM's order: the sampled token first, then the top-k without it, cut at top_logprobs.
    assert [t.token for t in second.top_logprobs] == [" world", " there"]
    assert second.top_logprobs[1].bytes == list(b" there")


def test_completion_logprobs_offsets_continue_across_chunks(decoder: TokenDecoder) -> None:
    tok = decoder.tokenizer
    ids = tok.encode("one two three").ids
    p = Pipeline(_spec(COMPLETION, 1), decoder)
    texts, offsets, tops = [], [], []
    for i, t in enumerate(ids):
        out = _output([t], [[t]], [[-0.5, -0.5]], [1], finish=1 if i == len(ids) - 1 else None)
        chunk, _ = p.feed(0, _wire([out])[0])
        assert isinstance(chunk, Completion)
        lp = chunk.choices[0].logprobs
        assert lp is not None
        texts += lp.tokens
        offsets += lp.text_offset
        tops += lp.top_logprobs
    assert "".join(texts) == "one two three"
    assert offsets == [0, 3, 7]
    # completions: logprobs + 1 candidates; here the sampled token is its own top-1.
    assert tops == [{"one": -0.5}, {" two": -0.5}, {" three": -0.5}]


def test_generate_logprobs_ranks_and_clamp(decoder: TokenDecoder) -> None:
    out = _output([5, 6], [[5, 9], [7, 8]], [[-math.inf, -math.inf, -1.0],
                                             [math.nan, -0.2, -0.3]], [1, 3])
    p = Pipeline(_spec(GENERATE, 2), decoder)
    chunk, _ = p.feed(0, _wire([out])[0])
    assert isinstance(chunk, GenerateResponse)
    lp = chunk.choices[0].logprobs
    assert isinstance(lp, GenerateLogprobs) and lp.content is not None
    first, second = lp.content
    assert (first.token_id, first.logprob, first.rank) == (5, -9999.0, 1)
    assert [(t.token_id, t.rank) for t in first.top_logprobs] == [(5, 1), (9, 2)]
    assert second.logprob == -9999.0 and second.rank == 3  # NaN is clamped, as vLLM does
    assert [(t.token_id, t.rank) for t in second.top_logprobs] == [(6, 3), (7, 1)]
    body = msgspec.json.encode(chunk)
    assert b"NaN" not in body and b"Infinity" not in body


def test_logprobs_trimmed_with_tokens_after_a_stop_string(decoder: TokenDecoder) -> None:
    ids = decoder.tokenizer.encode("alpha STOP beta gamma").ids
    top = [[i] for i in ids]
    out = _output(ids, top, [[-1.0, -1.0]] * len(ids), [1] * len(ids))
    p = Pipeline(_spec(CHAT, 0, stop=(" STOP",)), decoder)
    chunk, abort = p.feed(0, _wire([out])[0])
    assert abort  # the router ended it; the engine is still generating
    assert isinstance(chunk, ChatCompletionChunk)
    c = chunk.choices[0]
    assert c.delta.content == "alpha" and c.finish_reason == "stop" and c.stop_reason == " STOP"
    content = _content(c.logprobs)
    # Tokens up to the one completing the stop string keep their logprobs; the rest are dropped.
    kept = [e.token for e in content]
    assert "".join(kept) == "alpha STOP"
    assert all(e.top_logprobs == [] for e in content)  # top_logprobs=0
    assert p.usage().completion_tokens == len(kept)


def test_split_character_tokens_read_like_vllm(decoder: TokenDecoder) -> None:
    size = decoder.tokenizer.get_vocab_size(with_added_tokens=True)
    byte_tok = {decoder.token_bytes(i): i for i in range(size) if len(decoder.token_bytes(i)) == 1}
    hi = decoder.tokenizer.encode("Hi").ids
    ids = hi + [byte_tok[bytes([b])] for b in "日".encode()] + decoder.tokenizer.encode("!").ids
    out = _output(ids, [[t] for t in ids], [[-0.5, -0.5]] * len(ids), [1] * len(ids))
    chunk, _ = Pipeline(_spec(CHAT, 1), decoder).feed(0, _wire([out])[0])
    assert isinstance(chunk, ChatCompletionChunk) and chunk.choices[0].delta.content == "Hi日!"
    content = _content(chunk.choices[0].logprobs)
    # As vLLM shows them: "" for the leading bytes, the character on the byte completing it;
    # the raw bytes still concatenate to the exact UTF-8.
    assert [e.token for e in content] == ["Hi", "", "", "日", "!"]
    assert b"".join(bytes(e.bytes or []) for e in content) == "Hi日!".encode()
    assert content[3].top_logprobs[0].token == "日"
    comp, _ = Pipeline(_spec(COMPLETION, 0), decoder).feed(0, _wire([_output(
        ids, [[t] for t in ids], [[-0.5, -0.5]] * len(ids), [1] * len(ids))])[0])
    assert isinstance(comp, Completion)
    clp = comp.choices[0].logprobs
    assert clp is not None
    text = comp.choices[0].text
    assert "".join(clp.tokens) == text
    # text_offset now points at each token's text in the output.
    assert all(text[o:].startswith(t) for o, t in zip(clp.text_offset, clp.tokens, strict=True))
