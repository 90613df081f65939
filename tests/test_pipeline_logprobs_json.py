"""The logprobs hot path: wire arrays -> LogprobRows, and chat logprobs written as JSON.

The JSON writer must give exactly what msgspec writes for ``list[ChatLogprobsContent]`` built
the plain way (a reference below), for any tokens: byte-fallback pieces of split UTF-8
characters, special tokens, ids outside the vocabulary, NaN / infinite / tiny logprobs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from output.detokenize import TokenDecoder
from output.logprobs import FLOOR, ChoiceLogprobs
from output.openai_types import ChatCompletionChunk, ChatLogprobsContent, ChatTopLogprob
from output.pipeline import CHAT, Pipeline, PipelineSpec
from router.link.engine_outputs import ReceivedOutputs, decode_engine_outputs
from wire.engine import EngineCoreOutput, EngineCoreOutputs, enc_hook, ext_hook
from wire.ndarrays import (
    LogprobRows,
    NdarrayError,
    WireArray,
    WireLogprobs,
    encode_ndarray,
    rows_from_wire,
)

QWEN3 = Path(__file__).resolve().parent.parent / "render" / "models" / "qwen3" / "tokenizer.json"
ENC = msgspec.msgpack.Encoder(enc_hook=enc_hook)
RECEIVED = msgspec.msgpack.Decoder(ReceivedOutputs, ext_hook=ext_hook)


@pytest.fixture(scope="module")
def decoder() -> TokenDecoder:
    return TokenDecoder(Tokenizer.from_file(str(QWEN3)))


@pytest.fixture(scope="module")
def pools(decoder: TokenDecoder) -> dict[str, list[int]]:
    tok = decoder.tokenizer
    size = len(decoder.json_table)
    return {
        "text": tok.encode("Hello wörld, 日本語のテキスト 🎉🚀 ελληνικά\n\tquote\" \\").ids,
        # Single bytes >= 0x80: pieces of a UTF-8 character, "\ufffd" alone.
        "partial": [i for i in range(size) if len(b := decoder.token_bytes(i)) == 1
                    and b[0] >= 0x80][:64],
        "special": sorted(decoder.special_ids)[:16],
        "outside": [size, size + 7, 10**6],
    }


def _reference(decoder: TokenDecoder, ref: ChoiceLogprobs, num: int, token_ids: Sequence[int],
               rows: LogprobRows | None) -> list[ChatLogprobsContent]:
    """Chat logprobs the plain way: Structs per entry, vLLM's candidate order."""

    def clamp(x: float) -> float:
        return FLOOR if math.isnan(x) else max(x, FLOOR)

    def entry(t: int) -> tuple[str, list[int]]:
        return ref._fix(t, decoder.token_text(t)), list(decoder.token_bytes(t))

    out = []
    for i, tid in enumerate(token_ids):
        text, raw = entry(tid)
        if rows is None or i >= rows.num_tokens:
            out.append(ChatLogprobsContent(text, FLOOR, raw, []))
        else:
            w = rows.width
            ids, lps = rows.token_ids[i * w:(i + 1) * w], rows.logprobs[i * w:(i + 1) * w]
            top: list[ChatTopLogprob] = []
            for col, t in enumerate(ids):
                if 0 <= num <= len(top):
                    break
                if col and t == ids[0]:
                    continue
                ttext, traw = entry(t)
                top.append(ChatTopLogprob(ttext, clamp(lps[col]), traw))
            out.append(ChatLogprobsContent(text, clamp(lps[0]), raw, top))
        ref._sampled(tid)
    return out


LOGPROB = st.one_of(
    st.floats(-30.0, 0.0, width=32),
    st.sampled_from([math.nan, -math.inf, math.inf, -0.0, 0.0, -1e-7, -1.1920928955078125e-07,
                     -12345.0, -9999.0, -3.4028234663852886e38]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), num=st.integers(-1, 7), width=st.integers(1, 8),
       steps=st.integers(1, 5))
def test_chat_json_equals_msgspec_of_the_structs(decoder: TokenDecoder,
                                                 pools: dict[str, list[int]],
                                                 data: st.DataObject, num: int, width: int,
                                                 steps: int) -> None:
    ids_st = st.sampled_from(["text", "partial", "special", "outside"]).flatmap(
        lambda kind: st.sampled_from(pools[kind]))
    fast, ref = ChoiceLogprobs(decoder, num), ChoiceLogprobs(decoder, num)
    for _ in range(steps):
        sampled = data.draw(st.lists(ids_st, min_size=0, max_size=4))
        rows = None
        if data.draw(st.booleans()) or not sampled:
            n_rows = data.draw(st.integers(0, len(sampled)))
            flat_ids: list[int] = []
            for t in sampled[:n_rows]:
                # Column 0 is the sampled token; the sampled id may recur among the top-k.
                flat_ids += [t, *data.draw(st.lists(st.one_of(ids_st, st.just(t)),
                                                    min_size=width - 1, max_size=width - 1))]
            lps = data.draw(st.lists(LOGPROB, min_size=len(flat_ids), max_size=len(flat_ids)))
            rows = LogprobRows(flat_ids, lps, [1] * n_rows, width)
        got = fast.chat(sampled, rows)
        want = msgspec.json.encode(_reference(decoder, ref, num, sampled, rows))
        assert bytes(got) == want


def _raw(ids: np.ndarray, lps: np.ndarray, ranks: np.ndarray) -> tuple[list[bytes], object]:
    aux: list[bytes | memoryview] = [b""]
    wire = (encode_ndarray(ids, aux), encode_ndarray(lps, aux), encode_ndarray(ranks, aux), None)
    return [bytes(a) for a in aux[1:]], wire


@pytest.mark.parametrize("order", ["<", ">"])  # ">": an engine on a big-endian host
@pytest.mark.parametrize("k", [0, 5, 80])  # k=80: 324-byte rows travel as aux frames
def test_engine_client_decode_gives_rows(k: int, order: str) -> None:
    rng = np.random.default_rng(k)
    ids = rng.integers(0, 150000, (3, k + 1)).astype(order + "i4")
    lps = -rng.random((3, k + 1)).astype(order + "f4")
    ranks = np.array([1, 4, 2], dtype=order + "i8")
    aux, wire = _raw(ids, lps, ranks)
    assert (len(aux) > 0) == (k == 80)
    out = EngineCoreOutput("r", ids[:, 0].tolist(), new_logprobs=wire)
    payload = ENC.encode(EngineCoreOutputs(outputs=[out]))
    got = decode_engine_outputs(RECEIVED, [payload, *aux]).outputs[0].new_logprobs
    assert isinstance(got, LogprobRows)
    assert got.width == k + 1 and got.num_tokens == 3
    assert list(got.token_ids) == ids.reshape(-1).tolist()
    assert list(got.logprobs) == lps.reshape(-1).tolist()  # float32 values, exactly
    assert list(got.sampled_ranks) == [1, 4, 2]


@pytest.mark.parametrize("bad", [
    WireLogprobs(WireArray("<i4", (1, 2), msgspec.msgpack.Ext(3, bytes(4))),  # short buffer
                 WireArray("<f4", (1, 2), msgspec.msgpack.Ext(3, bytes(8))),
                 WireArray("<i8", (1,), msgspec.msgpack.Ext(3, bytes(8)))),
    WireLogprobs(WireArray("<i4", (1, 2), msgspec.msgpack.Ext(3, bytes(8))),
                 WireArray("<f4", (2, 1), msgspec.msgpack.Ext(3, bytes(8))),  # other shape
                 WireArray("<i8", (1,), msgspec.msgpack.Ext(3, bytes(8)))),
    WireLogprobs(WireArray("|O", (1, 1), msgspec.msgpack.Ext(3, bytes(8))),  # object dtype
                 WireArray("<f4", (1, 1), msgspec.msgpack.Ext(3, bytes(4))),
                 WireArray("<i8", (1,), msgspec.msgpack.Ext(3, bytes(8)))),
    WireLogprobs(WireArray("<i4", (1, 1), msgspec.msgpack.Ext(1, bytes(4))),  # pickle ext
                 WireArray("<f4", (1, 1), msgspec.msgpack.Ext(3, bytes(4))),
                 WireArray("<i8", (1,), msgspec.msgpack.Ext(3, bytes(8)))),
    WireLogprobs(WireArray("<i4", (1, 1), 3),  # aux frame that is not there
                 WireArray("<f4", (1, 1), msgspec.msgpack.Ext(3, bytes(4))),
                 WireArray("<i8", (1,), msgspec.msgpack.Ext(3, bytes(8)))),
])
def test_malformed_wire_logprobs_are_refused(bad: WireLogprobs) -> None:
    with pytest.raises(NdarrayError):
        rows_from_wire(bad, [b"payload"])


def _chunks(decoder: TokenDecoder, steps: list[list[int]], stop: tuple[str, ...]
            ) -> tuple[str, list[object], str | None]:
    """Feed per-step outputs (top-2 candidates = the token and token+1) through a pipeline."""
    p = Pipeline(PipelineSpec(kind=CHAT, request_id="r", model="m", created=0,
                              prompt_tokens=1, stop=stop, logprobs=2), decoder)
    p.start()
    text, content, finish = "", [], None
    for i, ids in enumerate(steps):
        rows = LogprobRows([x for t in ids for x in (t, t + 1, t)],
                           [-0.5, -1.5, -0.25] * len(ids), [1] * len(ids), 3)
        last = i == len(steps) - 1
        chunk, _ = p.feed(0, EngineCoreOutput("r", ids, new_logprobs=rows,
                                              finish_reason=1 if last else None))
        if chunk is None:
            continue
        assert isinstance(chunk, ChatCompletionChunk)
        c = chunk.choices[0]
        text += c.delta.content or ""
        assert c.logprobs is not None and c.logprobs.content is not None
        content += msgspec.json.decode(msgspec.json.encode(c.logprobs.content))
        finish = c.finish_reason or finish
        if finish is not None:
            break
    return text, content, finish


@pytest.mark.parametrize("stop", [(), (" fox",), ("日本",)])
def test_one_token_fast_path_equals_batched_steps(decoder: TokenDecoder,
                                                  stop: tuple[str, ...]) -> None:
    ids = decoder.tokenizer.encode("The quick brown fox jumps over 日本語 🎉 the lazy dog").ids
    one_by_one = _chunks(decoder, [[ids[0]], *[[t] for t in ids[1:]]], stop)
    batched = _chunks(decoder, [[ids[0]], ids[1:5], ids[5:9], ids[9:]], stop)
    assert one_by_one == batched
    assert one_by_one[2] == ("stop" if stop else "length")
    if stop:
        assert stop[0] not in one_by_one[0]
