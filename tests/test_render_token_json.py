"""render.token_json: token ids held as uint32 arrays answer with the bytes a list gives."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from render.errors import RenderError
from render.protocol import ChatCompletionRequest
from render.token_json import from_buffer, join, json_encoder
from tests.corpus import EMBEDDED, FAMILIES, conversations
from tests.test_render_parity import _marks, _need, renderer

_PLAIN = msgspec.json.Encoder()


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, 2**32 - 1), max_size=300),
       cut=st.integers(-310, 310), before=st.lists(st.integers(0, 2**20), max_size=2),
       after=st.lists(st.integers(0, 2**20), max_size=2))
def test_an_array_is_written_as_its_list(ids: list[int], cut: int, before: list[int],
                                         after: list[int]) -> None:
    arr = from_buffer(np.asarray(ids, dtype="<u4").tobytes())
    assert arr.tolist() == ids
    assert not arr.flags.writeable  # a view of the tokenizer's buffer (or the shared empty one)
    view = arr[cut:] if cut < 0 else arr[:cut]  # a truncated prompt is a view of the buffer
    joined = join(before, arr, after)
    doc: dict[str, Any] = {"request_id": "r", "token_ids": view, "nested": [joined, {"x": arr}],
                           "n": 3}
    expect = {"request_id": "r", "token_ids": view.tolist(),
              "nested": [before + ids + after, {"x": ids}], "n": 3}
    assert json_encoder().encode(doc) == _PLAIN.encode(expect)


def test_other_unknown_types_are_still_refused() -> None:
    with pytest.raises(NotImplementedError):
        json_encoder().encode({"x": object()})
    with pytest.raises(NotImplementedError):
        json_encoder().encode({"x": np.zeros((2, 2), dtype=np.uint32)})  # not 1-d


_VARIANTS: list[dict[str, Any]] = [
    {},
    {"truncate_prompt_tokens": 7, "truncation_side": "left"},
    {"truncate_prompt_tokens": 7, "truncation_side": "right"},
    {"add_special_tokens": True},
    {"return_token_offsets": True},
]


@pytest.mark.parametrize(
    "family", [pytest.param(f, marks=_marks(f)) for f in FAMILIES])
def test_array_answers_equal_list_answers_on_the_parity_corpus(family: str) -> None:
    _need(family)
    r = renderer(family)
    encoder = json_encoder()
    arrays = 0
    for name, body in conversations(family):
        for variant in _VARIANTS:
            req = msgspec.convert({**body, **variant, "request_id": name},
                                  ChatCompletionRequest)
            try:
                as_list = _PLAIN.encode(r.render_chat(req))
            except RenderError as e:
                with pytest.raises(type(e)):
                    r.render_chat(req, array=True)
                continue
            out = r.render_chat(req, array=True)
            arrays += isinstance(out.token_ids, np.ndarray)
            assert encoder.encode(out) == as_list, (name, variant)
    # The families fastokens encodes answer with arrays (else this test checks nothing new).
    if family in EMBEDDED:
        assert arrays > 0
