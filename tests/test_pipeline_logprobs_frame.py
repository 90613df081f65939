"""Logprobs formatted a whole engine message at a time: each fast path against the general one.

``RowLayouts`` (one struct unpack per output) against the general wire decode,
``float_texts`` against msgspec of the clamped numbers, ``ChoiceLogprobs.chat_one`` (slices of
the message's candidate objects) against ``chat`` and against msgspec of the Structs, the byte-
level ``_decode`` against the tokenizer, on random messages: byte-fallback pieces of split UTF-8
characters, special tokens, ids outside the vocabulary, NaN / infinite / tiny logprobs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from output.detokenize import TokenDecoder
from output.logprobs import ChoiceLogprobs
from output.pipeline import CHAT, Pipeline, PipelineSpec
from router.link.engine_outputs import OutputDecoder, ReceivedOutputs, decode_engine_outputs
from tests.test_pipeline_logprobs_json import ENC, LOGPROB, _reference
from tests.test_pipeline_logprobs_json import decoder as decoder  # the module's fixture
from wire.engine import EngineCoreOutput, EngineCoreOutputs, ext_hook
from wire.logprob_frame import FLOOR, float_texts
from wire.logprob_layout import RowLayouts, rows_from_raw
from wire.ndarrays import LogprobRows, encode_ndarray

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def pools(decoder: TokenDecoder) -> dict[str, list[int]]:
    tok = decoder.tokenizer
    size = len(decoder.json_table)
    raw = [decoder.token_bytes(i) for i in range(size)]
    cont = [i for i, b in enumerate(raw) if b and all(x & 0xC0 == 0x80 for x in b)]
    # Ends inside a character but starts with a lead byte: "" after any context.
    lead = [i for i, b in enumerate(raw) if b and b[0] >= 0xC0 and len(b) > 1
            and decoder.token_text(i).endswith("\ufffd")]
    return {
        "text": tok.encode("Hello wörld, 日本語のテキスト 🎉🚀 ελληνικά\n\tquote\" \\").ids,
        "continuation": cont[:48] + cont[-16:],
        "lead": lead[:48],
        "special": sorted(decoder.special_ids)[:16],
        "outside": [size, size + 7, 10**6],
    }


def _ids(pools: dict[str, list[int]], outside: bool = True) -> st.SearchStrategy[int]:
    kinds = [k for k in pools if outside or k != "outside"]
    return st.sampled_from(kinds).flatmap(lambda k: st.sampled_from(pools[k]))


def _encoded(ids: np.ndarray, lps: np.ndarray, ranks: np.ndarray, cu: list[int] | None
             ) -> tuple[Any, list[bytes]]:
    aux: list[bytes | memoryview] = [b""]
    wire = (encode_ndarray(ids, aux), encode_ndarray(lps, aux), encode_ndarray(ranks, aux), cu)
    return wire, [bytes(a) for a in aux[1:]]


@SETTINGS
@given(data=st.data(), n=st.integers(0, 3), width=st.integers(1, 40),
       order=st.sampled_from(["<", ">"]), rank_dtype=st.sampled_from(["i4", "i8"]),
       cu=st.sampled_from([None, [0, 1]]))
def test_layout_rows_equal_general_decode(data: st.DataObject, n: int, width: int, order: str,
                                          rank_dtype: str, cu: list[int] | None) -> None:
    layouts = RowLayouts()
    for _ in range(3):  # the first message learns the layout, the next ones use it
        ids = np.array(data.draw(st.lists(st.integers(-2**31, 2**31 - 1), min_size=n * width,
                                          max_size=n * width)), dtype=order + "i4")
        lps = np.array(data.draw(st.lists(LOGPROB, min_size=n * width, max_size=n * width)),
                       dtype=order + "f4")
        ranks = np.arange(n, dtype=order + rank_dtype)
        wire, aux = _encoded(ids.reshape(n, width), lps.reshape(n, width), ranks, cu)
        raw = msgspec.Raw(ENC.encode(wire))
        frames = [b"payload", *aux]
        got, want = layouts.rows(raw, frames), rows_from_raw(raw, frames)
        assert (list(got.token_ids), got.width, list(got.sampled_ranks)) == (
            list(want.token_ids), want.width, list(want.sampled_ranks))
        assert msgspec.json.encode(list(got.logprobs)) == msgspec.json.encode(list(want.logprobs))
        assert list(got.token_ids) == ids.tolist()


def test_layout_of_another_shape_with_the_same_length_is_relearned() -> None:
    layouts = RowLayouts()
    little, big = (_encoded(np.arange(6, dtype=o + "i4").reshape(1, 6),
                            np.full((1, 6), -0.5, dtype=o + "f4"),
                            np.array([1], dtype=o + "i4"), None)[0] for o in "<>")
    for wire in (little, big, little, big):
        raw = msgspec.Raw(ENC.encode(wire))
        assert list(layouts.rows(raw, ()).token_ids) == [0, 1, 2, 3, 4, 5]


@given(st.lists(LOGPROB, max_size=20))
def test_float_texts_equal_msgspec_of_the_clamped_numbers(lps: list[float]) -> None:
    clamped = [FLOOR if math.isnan(x) else max(x, FLOOR) for x in lps]
    assert b"[" + b",".join(float_texts(lps)) + b"]" == msgspec.json.encode(clamped)


@SETTINGS
@given(ids=st.lists(st.integers(0, 151_700), max_size=8))
def test_byte_level_decode_equals_the_tokenizer(decoder: TokenDecoder, ids: list[int]) -> None:
    lp = ChoiceLogprobs(decoder, 1)
    assert lp._decode(ids) == decoder.tokenizer.decode(ids, skip_special_tokens=False)


@SETTINGS
@given(data=st.data(), num=st.integers(-1, 7), width=st.integers(1, 8),
       requests=st.integers(1, 4), steps=st.integers(1, 6))
def test_chat_one_equals_chat_and_the_structs(decoder: TokenDecoder,
                                              pools: dict[str, list[int]], data: st.DataObject,
                                              num: int, width: int, requests: int,
                                              steps: int) -> None:
    """Messages of several outputs (one token each, as the engine streams), decoded as the
    engine client does; per output the fast path, the general path and the Structs agree."""
    ids_st = _ids(pools, outside=data.draw(st.booleans()))
    fast = [ChoiceLogprobs(decoder, num) for _ in range(requests)]
    slow = [ChoiceLogprobs(decoder, num) for _ in range(requests)]
    ref = [ChoiceLogprobs(decoder, num) for _ in range(requests)]
    dec = OutputDecoder()
    for _ in range(steps):
        outs = []
        for r in range(requests):
            t = data.draw(ids_st)
            row = [t, *data.draw(st.lists(st.one_of(ids_st, st.just(t)), min_size=width - 1,
                                          max_size=width - 1))]
            lps = data.draw(st.lists(LOGPROB, min_size=width, max_size=width))
            wire, _ = _encoded(np.array([row], dtype="<i4"), np.array([lps], dtype="<f4"),
                               np.array([1], dtype="<i4"), None)
            outs.append(EngineCoreOutput(f"r{r}", [t], new_logprobs=wire))
        got = decode_engine_outputs(dec, [ENC.encode(EngineCoreOutputs(outputs=outs))])
        for r, out in enumerate(got.outputs):
            rows = out.new_logprobs
            assert isinstance(rows, LogprobRows) and rows.frame is not None
            tid = out.new_token_ids[0]
            one = fast[r].chat_one(tid, rows)
            general = slow[r].chat([tid], LogprobRows(rows.token_ids, rows.logprobs,
                                                      rows.sampled_ranks, rows.width))
            want = msgspec.json.encode(_reference(decoder, ref[r], num, [tid], rows))
            assert bytes(one) == bytes(general) == want


def test_pipeline_stream_on_engine_messages_equals_the_general_path(decoder: TokenDecoder
                                                                    ) -> None:
    """Whole chat streams (top-5, a stop string) through OutputDecoder vs the plain decoder."""
    text = "The quick brown fox 日本語のテキスト 🎉🚀 jumps over ελληνικά, the lazy dog. " * 3
    tokens = decoder.tokenizer.encode(text).ids
    rng = np.random.default_rng(7)
    messages = []
    for s, t in enumerate(tokens):
        outs = []
        for r in range(3):
            row = np.array([[t, *rng.integers(0, 151_000, 5)]], dtype=np.int32)
            lps = -np.sort(rng.random((1, 6)).astype(np.float32), axis=1)
            if s % 11 == 0:
                lps[0, 3] = -np.inf
            wire, _ = _encoded(row, lps, np.array([1], dtype=np.int32), None)
            outs.append(EngineCoreOutput(f"r{r}", [t], new_logprobs=wire,
                                         finish_reason=1 if s == len(tokens) - 1 else None))
        messages.append(ENC.encode(EngineCoreOutputs(outputs=outs)))

    built = []

    def stream(dec: Any, frames: bool) -> list[bytes]:
        enc = msgspec.json.Encoder()
        pipes = [Pipeline(PipelineSpec(kind=CHAT, request_id=f"c{r}", model="m", created=0,
                                       prompt_tokens=1, stop=("never",), logprobs=5), decoder)
                 for r in range(3)]
        got = [enc.encode(c) for p in pipes for c in p.start()]
        for m in messages:
            for out in decode_engine_outputs(dec, [m]).outputs:
                rows = out.new_logprobs
                assert isinstance(rows, LogprobRows)
                frame = rows.frame
                assert frame is not None
                if not frames:
                    rows.frame = None  # ChoiceLogprobs.chat, token by token
                chunk, _ = pipes[int(out.request_id[1:])].feed(0, out)
                if frames:
                    built.append((decoder, 5) in frame.entries)
                if chunk is not None:
                    got.append(enc.encode(chunk))
        return got

    fast = stream(OutputDecoder(), True)
    general = stream(msgspec.msgpack.Decoder(ReceivedOutputs, ext_hook=ext_hook), False)
    assert fast == general
    assert sum(built) > len(built) // 2  # the message-wide path did run
    assert len(fast) > len(tokens) and b'"top_logprobs":[{' in fast[5]


def test_vllm_golden_outputs_read_by_layout_equal_the_general_decode() -> None:
    """vLLM's own bytes (tests/data/wire_golden.json): the layout path reads them as the general
    decode does, twice (learning the layout, then using it)."""
    golden = json.loads((Path(__file__).parent / "data" / "wire_golden.json").read_text())
    cases = [c for c in golden["outputs"] if "logprob_ids" in c["expect"]]
    assert cases
    dec = OutputDecoder()
    plain = msgspec.msgpack.Decoder(ReceivedOutputs, ext_hook=ext_hook)
    for case in cases * 2:
        frames = [bytes.fromhex(f) for f in case["frames_hex"]]
        for a, b in zip(decode_engine_outputs(dec, frames).outputs,
                        decode_engine_outputs(plain, frames).outputs, strict=True):
            if b.new_logprobs is None:
                assert a.new_logprobs is None
                continue
            assert isinstance(a.new_logprobs, LogprobRows)
            assert isinstance(b.new_logprobs, LogprobRows)
            assert (a.new_logprobs.token_ids, a.new_logprobs.logprobs) == (
                b.new_logprobs.token_ids, b.new_logprobs.logprobs)
            assert list(a.new_logprobs.sampled_ranks) == list(b.new_logprobs.sampled_ranks)
    assert any(lay is not None for lay in dec.layouts._by_len.values())
